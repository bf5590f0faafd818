"""``vaecf evaluate`` end to end on a synthetic split: baselines, a SavedModel, bad input."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from vaecf.baselines.popularity import Popularity
from vaecf.data.splits import load_split
from vaecf.io import write_manifest
from vaecf.metrics import evaluate

KEYS = ("recall_at_20", "recall_at_50", "ndcg_at_100")


def run_ok(cli, *argv: object) -> dict:  # type: ignore[no-untyped-def]
    code, _, err = cli("evaluate", *argv)
    assert code == 0, err
    output = Path(str(argv[list(argv).index("--output") + 1]))
    return json.loads((output / "metrics.json").read_text())


def test_ease_beats_popularity(synthetic_split, cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    split = synthetic_split()
    ease = run_ok(cli, "--split", split, "--model", "ease", "--output", tmp_path / "ease",
                  "--baselines", "popularity", "ease")
    popularity = run_ok(cli, "--split", split, "--model", "popularity",
                        "--output", tmp_path / "pop")
    for key in KEYS:
        assert ease[key]["mean"] > popularity[key]["mean"] + 0.05, key
        assert ease["baselines"]["popularity"][key] == popularity[key]
        assert ease["baselines"]["ease"][key] == ease[key]
        # Paired on the same users: the mean difference is the difference of the means.
        versus = ease["baselines"]["popularity"]["paired"][key]
        assert versus["delta"] == pytest.approx(ease[key]["mean"] - popularity[key]["mean"])
        assert versus["users"] == ease["users_evaluated"] and versus["z"] > 2.0
        assert versus["test"] == "paired z-test on per-user differences"
        assert ease["baselines"]["ease"]["paired"][key]["delta"] == 0.0
    manifest = json.loads((split / "dataset_manifest.json").read_text())
    assert ease["users_evaluated"] + ease["users_skipped"] == manifest["n_users"]["test"]
    assert ease["users_evaluated"] > 0
    assert (ease["subset"], ease["model"], ease["n_items"]) == ("test", "ease",
                                                                manifest["n_items"])
    assert ease["device"].endswith("CPU:0")
    # All users fit the first chunk (4,096): no whole chunk after it, so no steady rate.
    timing = ease["timing"]
    assert ease["users_per_second"] is None and timing["users_per_second"] is None
    assert timing["steady_chunks"] == timing["steady_users"] == 0
    assert timing["first_chunk_users"] == ease["users_evaluated"]
    assert timing["steady_rate"].startswith("none: ") and "--batch-users" in timing["steady_rate"]


def test_rerun_is_identical_and_top_k_skips_fold_in(synthetic_split, cli, tmp_path: Path
                                                    ) -> None:  # type: ignore[no-untyped-def]
    split_dir = synthetic_split()
    args = ("--split", split_dir, "--model", "ease", "--subset", "val", "--batch-users", "5",
            "--export-top-k", "10")
    first = run_ok(cli, *args, "--output", tmp_path / "a")
    second = run_ok(cli, *args, "--output", tmp_path / "b")
    rate = first.pop("users_per_second")
    assert rate > 0 and second.pop("users_per_second") > 0
    timing = first.pop("timing")
    second.pop("timing")
    assert first == second
    # start-up (the first chunk of 5) and a partial last chunk are apart from the steady rate
    users = first["users_evaluated"]
    assert timing["first_chunk_users"] == 5 and timing["steady_seconds"] > 0
    assert timing["steady_chunks"] == users // 5 - 1 >= 1
    assert timing["steady_users"] == 5 * timing["steady_chunks"]
    assert timing["partial_chunk_users"] == users % 5
    assert timing["startup_seconds"] == pytest.approx(
        timing["process_seconds_before_stage"] + timing["load_seconds"]
        + timing["first_chunk_seconds"], abs=2e-3)
    assert timing["users_per_second"] == rate
    seconds = timing["steady_seconds"]  # rounded to the millisecond
    assert timing["steady_users"] / (seconds + 5e-4) <= rate <= (
        timing["steady_users"] / max(seconds - 5e-4, 1e-9))
    assert timing["steady_rate"].startswith(f"{timing['steady_chunks']} whole chunk")
    assert timing["process_seconds_before_stage"] > 0  # this test process imported TF first
    parquet = [(tmp_path / run / "top_k.parquet").read_bytes() for run in ("a", "b")]
    assert parquet[0] == parquet[1]
    manifests = [json.loads((tmp_path / run / "evaluate_manifest.json").read_text())
                 for run in ("a", "b")]
    assert manifests[0].pop("run") and manifests[1].pop("run")
    assert manifests[0]["files"]["top_k.parquet"] == manifests[1]["files"]["top_k.parquet"]
    for manifest in manifests:
        manifest["files"].pop("metrics.json")  # differs in users_per_second only (above)
    assert manifests[0] == manifests[1]
    assert manifests[0]["parameters"] == {"subset": "val", "batch_users": 5, "export_top_k": 10,
                                          "baselines": [], "ease_lambda": 500.0}

    split = load_split(split_dir)
    fold_in, holdout = split.heldout("val")
    top = pd.read_parquet(tmp_path / "a" / "top_k.parquet")
    rows = top["user_idx"].to_numpy() - split.manifest["user_offset"]["val"]
    assert not np.asarray(fold_in[rows, top["item_idx"].to_numpy()]).any()
    assert set(np.unique(rows)) == set(np.flatnonzero(np.diff(holdout.indptr)))
    assert top.groupby("user_idx")["rank"].apply(list).map(lambda r: r == list(range(1, 11))).all()
    assert (top.groupby("user_idx")["score"].diff().dropna() <= 0).all()
    np.testing.assert_array_equal(top["item_id"], split.item_ids[top["item_idx"]])
    users = pd.read_parquet(split_dir / "user_index.parquet").set_index("user_idx")["user_id"]
    np.testing.assert_array_equal(top["user_id"], users.loc[top["user_idx"]].to_numpy())


def export_model(directory: Path, weights: np.ndarray, n_items_in_manifest: int,
                 split_digest: str, train: sp.csr_matrix | None = None) -> Path:
    """A tiny SavedModel with the trainer's ``score`` signature: scores = x_u @ weights,
    recorded as trained on the split ``split_digest``; with ``train``, it carries that
    training matrix's popularity as the trainer's export does."""
    import tensorflow as tf

    n_items = weights.shape[0]

    class Tiny(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weights = tf.Variable(weights)
            if train is not None:
                self.popularity = tf.Variable(Popularity(train).counts)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="row_splits"),
                                      tf.TensorSpec([None], tf.int64, name="item_idx")])
        def score(self, row_splits: tf.Tensor, item_idx: tf.Tensor) -> dict[str, tf.Tensor]:
            rows = tf.ragged.row_splits_to_segment_ids(row_splits)
            users = tf.shape(row_splits, out_type=tf.int64)[0] - 1
            x = tf.scatter_nd(tf.stack([rows, item_idx], axis=1),
                              tf.ones(tf.shape(item_idx), tf.float32), [users, n_items])
            return {"scores": tf.matmul(x, self.weights)}

    model = Tiny()
    directory.mkdir()
    tf.saved_model.save(model, str(directory / "saved_model"), signatures={"score": model.score})
    write_manifest(directory, "train", inputs={}, parameters={}, counts={},
                   started=time.monotonic(),
                   extra={"n_items": n_items_in_manifest, "best_epoch": 1,
                          "split_digest": split_digest})
    return directory


def test_saved_model_is_scored_through_its_score_signature(synthetic_split, cli, tmp_path: Path
                                                           ) -> None:  # type: ignore[no-untyped-def]
    split_dir = synthetic_split()
    split = load_split(split_dir)
    # Item co-occurrence counts: integers, so TF and scipy compute identical scores.
    binary = sp.csr_matrix(split.train, dtype=np.float32)
    weights = (binary.T @ binary).toarray().astype(np.float32)
    np.fill_diagonal(weights, 0.0)
    model = export_model(tmp_path / "model", weights, split.n_items, split.digest, split.train)
    metrics = run_ok(cli, "--split", split_dir, "--model", model, "--output", tmp_path / "out")
    fold_in, holdout = split.heldout("test")
    expected = evaluate(lambda rows: np.asarray(rows @ weights), fold_in, holdout,
                        engine="numpy").summary()
    # The same scores, so the same rankings: recall and the counts are equal exactly. NDCG
    # sums its discounts in another order in TensorFlow than in numpy, which can leave a
    # user's value one ulp apart (2 users of this split, 1.1e-16): equal to rounding.
    assert {key: metrics[key] for key in expected if key != "ndcg_at_100"} == {
        key: value for key, value in expected.items() if key != "ndcg_at_100"}
    for part in ("mean", "stderr"):
        assert metrics["ndcg_at_100"][part] == pytest.approx(
            expected["ndcg_at_100"][part], rel=1e-12, abs=0.0)
    assert metrics["model"] == str(model)


def one_line_error(cli, output: Path, *argv: object) -> str:  # type: ignore[no-untyped-def]
    code, _, err = cli("evaluate", *argv, "--output", output)
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("vaecf evaluate: error: ")
    assert not output.exists()
    return err


def test_ease_that_does_not_fit_in_memory_is_refused_in_one_line(
        synthetic_split, cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    import vaecf.baselines.ease

    monkeypatch.setattr(vaecf.baselines.ease, "available_bytes", lambda: 1 << 20)
    err = one_line_error(cli, tmp_path / "out", "--split", synthetic_split(),
                         "--model", "popularity", "--baselines", "ease")
    assert "GiB is available (leave ease out of --baselines" in err


def test_model_trained_on_other_items_is_refused(synthetic_split, cli, tmp_path: Path
                                                 ) -> None:  # type: ignore[no-untyped-def]
    split_dir = synthetic_split()
    split = load_split(split_dir)
    n_items = split.n_items
    model = export_model(tmp_path / "model", np.zeros((n_items, n_items), np.float32),
                         n_items + 1, split.digest)
    err = one_line_error(cli, tmp_path / "out", "--split", split_dir, "--model", model)
    assert f"trained on {n_items + 1} items but the split has {n_items}" in err


def test_model_trained_on_another_split_is_refused(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Split seeds 7 and 98765 of the same data: same items, other training users (some of
    the model's training users are the other split's test users)."""
    for argv in (["download", "--dataset", "synthetic", "--synthetic-users", "600",
                  "--synthetic-items", "100", "--output", tmp_path / "raw"],
                 ["preprocess", "--input", tmp_path / "raw", "--output", tmp_path / "inter"],
                 *(["split", "--input", tmp_path / "inter", "--output", tmp_path / f"s{seed}",
                    "--seed", seed] for seed in (7, 98765))):
        assert cli(*argv)[0] == 0
    ours, other = load_split(tmp_path / "s7"), load_split(tmp_path / "s98765")
    assert ours.n_items == other.n_items and ours.digest != other.digest
    model = export_model(tmp_path / "model", np.eye(ours.n_items, dtype=np.float32),
                         ours.n_items, ours.digest, ours.train)
    run_ok(cli, "--split", tmp_path / "s7", "--model", model, "--output", tmp_path / "ok")
    err = one_line_error(cli, tmp_path / "out", "--split", tmp_path / "s98765", "--model", model)
    assert (f"{model}: the model was trained on another split (split digest "
            f"{ours.digest[:12]}, this split's {other.digest[:12]})") in err


def test_split_manifest_must_list_the_files_read(synthetic_split, cli, tmp_path: Path
                                                 ) -> None:  # type: ignore[no-untyped-def]
    split = tmp_path / "split"
    shutil.copytree(synthetic_split(), split)
    manifest = json.loads((split / "dataset_manifest.json").read_text())
    del manifest["files"]["item_index.parquet"]
    (split / "dataset_manifest.json").write_text(json.dumps(manifest))
    (split / "item_index.parquet").unlink()
    err = one_line_error(cli, tmp_path / "out", "--split", split, "--model", "popularity")
    assert f"{split / 'item_index.parquet'}: not listed in dataset_manifest.json" in err


@pytest.mark.parametrize(("flags", "message"), [
    (["--export-top-k", "0"], "--export-top-k 0: expected 1.."),
    (["--subset", "train"], "--subset: unknown subset 'train'"),
    (["--baselines", "itemknn"], "--baselines: unknown baseline 'itemknn'"),
    (["--batch-users", "0"], "--batch-users 0: expected 1.."),
    (["--model", "missing-model-dir"], "missing-model-dir: input directory does not exist"),
])
def test_bad_flags(synthetic_split, cli, tmp_path: Path, flags: list[str], message: str
                   ) -> None:  # type: ignore[no-untyped-def]
    argv = ["--split", synthetic_split(), "--model", "popularity", *flags]
    assert message in one_line_error(cli, tmp_path / "out", *argv)


@pytest.mark.parametrize(("damage", "message"), [
    ("dataset_manifest.json", "manifest missing (is "),
    ("dataset_manifest.json", "the output of 'vaecf split'?)"),
    ("test_holdout.npz", "SHA-256 does not match"),
])
def test_bad_split(synthetic_split, cli, tmp_path: Path, damage: str, message: str
                   ) -> None:  # type: ignore[no-untyped-def]
    split = tmp_path / "split"
    shutil.copytree(synthetic_split(), split)
    if damage.endswith(".json"):
        (split / damage).unlink()
    else:
        data = bytearray((split / damage).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (split / damage).write_bytes(bytes(data))
    err = one_line_error(cli, tmp_path / "out", "--split", split, "--model", "popularity")
    assert message in err and damage in err


def test_publishes_to_s3(synthetic_split, cli, s3_bucket: str) -> None:  # type: ignore[no-untyped-def]
    from vaecf.io.storage import list_keys

    output = f"s3://{s3_bucket}/eval"
    code, _, err = cli("evaluate", "--split", synthetic_split(), "--model", "popularity",
                       "--output", output, "--export-top-k", "3")
    assert code == 0, err
    assert list_keys(output) == ["_SUCCESS", "evaluate_manifest.json", "metrics.json",
                                 "top_k.parquet"]
