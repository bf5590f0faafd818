"""EASE in the exported scores: the blend's arithmetic by hand, EASE's scores against numpy,
the SavedModel's signatures with it, the choice's rule on the validation users, where it is
off, and what ``vaecf train`` exports and records."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from vaecf.baselines.ease import ease_weights, gram
from vaecf.data.splits import load_split
from vaecf.metrics import evaluate
from vaecf.metrics.model_scorer import SavedModelScorer
from vaecf.model import MultVAE, SparseBatch
from vaecf.train import ease_blend
from vaecf.train.config import TrainConfig
from vaecf.train.export import EaseBlend, blend, ease_scores, export, ragged_batch


def test_the_blend_is_the_sum_of_the_rows_standardised() -> None:
    logits = np.array([[1, 2, 3, 6], [4, 4, 4, 4]], np.float32)
    ease = np.array([[0, 1, 0, 1], [2, 0, 0, 0]], np.float32)
    got = blend(tf.constant(logits), tf.constant(ease), 0.5).numpy()
    # row 0: logits mean 3, variance 14/4; EASE mean 0.5, variance 0.25. Row 1: constant
    # logits (all 0 once standardised); EASE mean 0.5, variance 0.75.
    expected = [np.array([-2, -1, 0, 3]) / np.sqrt(3.5) + 0.5 * np.array([-1, 1, -1, 1]),
                0.5 * np.array([1.5, -0.5, -0.5, -0.5]) / np.sqrt(0.75)]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_ease_scores_are_the_users_rows_times_b() -> None:
    weights = np.random.default_rng(0).normal(size=(6, 6)).astype(np.float32)
    # users {4, 1}, {}, {0, 5, 2}: items not in order, a user without items
    batch = ragged_batch(tf.constant([0, 2, 2, 5], tf.int64),
                         tf.constant([4, 1, 0, 5, 2], tf.int64))
    rows = np.zeros((3, 6), np.float32)
    rows[0, [4, 1]] = rows[2, [0, 5, 2]] = 1
    np.testing.assert_allclose(ease_scores(batch, tf.constant(weights)).numpy(), rows @ weights,
                               rtol=1e-5, atol=1e-5)


def test_the_saved_model_ranks_by_the_blend(tmp_path: Path) -> None:
    n_items = 8
    model = MultVAE(n_items, hidden=8, latent=4, dropout=0.0, policy="float32")
    model.build_variables()
    weights = np.random.default_rng(1).normal(size=(n_items, n_items)).astype(np.float32)
    common = {"n_items": n_items, "hidden": 8, "latent": 4, "item_ids": np.arange(n_items),
              "popularity": np.arange(n_items, dtype=np.float64)}
    export(model.get_weights(), path=tmp_path / "alone", **common)
    export(model.get_weights(), path=tmp_path / "blended", **common,
           ease=EaseBlend(weights, 0.3))
    users = {"row_splits": tf.constant([0, 2, 3], tf.int64),
             "item_idx": tf.constant([1, 6, 3], tf.int64)}
    alone = tf.saved_model.load(str(tmp_path / "alone")).signatures["score"](**users)["scores"]
    saved = tf.saved_model.load(str(tmp_path / "blended"))
    rows = np.zeros((2, n_items), np.float32)
    rows[0, [1, 6]] = rows[1, 3] = 1
    expected = blend(alone, tf.constant(rows @ weights), 0.3).numpy()
    np.testing.assert_allclose(saved.signatures["score"](**users)["scores"].numpy(), expected,
                               rtol=1e-5, atol=1e-5)
    top = saved.signatures["recommend"](**users, k=tf.constant(3))
    masked = expected.copy()
    masked[0, [1, 6]] = masked[1, 3] = -np.inf
    assert top["item_idx"].numpy().tolist() == np.argsort(-masked, axis=1)[:, :3].tolist()


class _Logits:
    """A module double: its logits a function of the batch."""

    def __init__(self, logits: Callable[[SparseBatch], tf.Tensor]) -> None:
        self.logits = logits


@pytest.fixture(scope="module")
def data(synthetic_split) -> tuple[sp.csr_matrix, sp.csr_matrix, sp.csr_matrix]:  # type: ignore[no-untyped-def]
    split = load_split(synthetic_split())
    return (split.train, *split.heldout("val"))


def test_a_blend_that_cannot_lead_exports_the_model_alone(data) -> None:  # type: ignore[no-untyped-def]
    """A model whose logits are EASE's own scores: every weight ranks as the model alone
    does, so no lead, none larger than its standard error (0), and no EASE exported."""
    train, fold_in, holdout = data
    weights = tf.constant(ease_weights(train, 500.0))
    chosen, record = ease_blend.choose(_Logits(lambda batch: ease_scores(batch, weights)),  # type: ignore[arg-type]
                                       gram(train), 500.0, fold_in, holdout)
    assert chosen is None and record["weight"] == 0.0
    assert record["paired"]["delta"] == pytest.approx(0.0, abs=1e-12)
    assert set(record["val_ndcg_at_100"]) == {str(w) for w in (0.0, *ease_blend.WEIGHTS)}
    assert record["val"]["ndcg_at_100"] == pytest.approx(record["val_ndcg_at_100"]["0.0"])


def test_a_blend_that_leads_by_more_than_its_error_is_exported(data) -> None:  # type: ignore[no-untyped-def]
    """A model that knows nothing (equal logits for every item): any weight ranks by EASE,
    far ahead; of equal weights the smallest is the candidate, and it is kept."""
    train, fold_in, holdout = data
    chosen, record = ease_blend.choose(
        _Logits(lambda batch: tf.zeros([tf.shape(batch.user_idx)[0], train.shape[1]])),  # type: ignore[arg-type]
        gram(train), 500.0, fold_in, holdout)
    assert chosen is not None and chosen.weight == record["weight"] == ease_blend.WEIGHTS[0]
    np.testing.assert_array_equal(chosen.weights, ease_weights(train, 500.0))
    paired = record["paired"]
    assert paired["delta"] > paired["stderr"] > 0
    ease = evaluate(lambda rows: np.asarray(rows @ chosen.weights), fold_in, holdout)
    assert record["val"]["ndcg_at_100"] == pytest.approx(ease.metrics["ndcg_at_100"].mean)


def test_where_the_blend_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def config(**given: object) -> TrainConfig:
        return TrainConfig(split="s", output="o", checkpoint_dir="c", **given)  # type: ignore[arg-type]

    assert ease_blend.why_off(config(), 300) is None
    assert ease_blend.why_off(config(ease_blend="off"), 300) == "--ease-blend off"
    assert ease_blend.why_off(config(shard_items=True), 300).startswith("--shard-items")
    assert ease_blend.why_off(config(), 30_000).startswith("30,000 items: more than 25,000")
    monkeypatch.setattr(ease_blend, "memory_bytes", lambda: 12 * 300 * 300 - 1)
    assert "more than the memory available" in ease_blend.why_off(config(), 300)


@pytest.mark.parametrize("blend_flag", ["auto", "off"])
def test_train_exports_what_it_chose_and_records_it(synthetic_split, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                    blend_flag: str) -> None:
    from vaecf.cli import main

    split_dir, model = synthetic_split(), tmp_path / "model"
    assert main(["train", "--split", str(split_dir), "--output", str(model), "--epochs", "2",
                 "--batch-size", "100", "--hidden", "32", "--latent", "8",
                 "--ease-blend", blend_flag]) == 0
    manifest = json.loads((model / "train_manifest.json").read_text())
    split = load_split(split_dir)
    scorer = SavedModelScorer(model, split.n_items, split.digest, split.train)
    exported = evaluate(scorer, *split.heldout("val")).metrics["ndcg_at_100"].mean
    record = manifest["ease_blend"]
    if blend_flag == "off":
        assert record == {"off": "--ease-blend off"}
        assert exported == pytest.approx(manifest["best_val"]["ndcg_at_100"], abs=1e-6)
        return
    assert record["weight"] in (0.0, *ease_blend.WEIGHTS) and record["lambda"] == 500.0
    assert exported == pytest.approx(record["val"]["ndcg_at_100"], abs=1e-6)
    assert record["val_ndcg_at_100"]["0.0"] == pytest.approx(
        manifest["best_val"]["ndcg_at_100"], abs=1e-6)
