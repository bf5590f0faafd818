"""RecVAE's training options and ImplicitSLIM's embedding step (``vaecf train`` flags).

Off (the default), the model and the step are Mult-VAE's exactly as before they existed: the
trajectories below were recorded with the code that had no such options (``python
tests/unit/test_training_options.py`` prints them, with any ``PYTHONPATH``). On, each is
checked against what it claims: a reference formula, an equivalence or the variables it
may change.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf
from scipy.stats import norm
from single_steps import lone_step

from vaecf.baselines import Popularity
from vaecf.model import MultVAE, SparseBatch
from vaecf.model.vae import PHASES
from vaecf.train import horovod as dist
from vaecf.train.config import TrainConfig

N_ITEMS = 37
RUNTIME = dist.Runtime(rank=0, size=1, local_rank=0, hosts=1, hvd=None)
OPTIONS = {"kl_per_item": 0.01, "composite_prior": True, "encoder_layers": 3}


def batch(users: int = 5, seed: int = 0, per_user: int = 4) -> SparseBatch:
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(users), per_user)
    items = np.concatenate([rng.choice(N_ITEMS, per_user, replace=False)
                            for _ in range(users)])
    return SparseBatch(tf.constant(rows, tf.int64), tf.constant(items, tf.int64),
                       tf.ones([rows.size]), tf.range(users, dtype=tf.int64))


def make_step(precision: str = "fp32", item_chunk: int | None = None,
              phases: tuple[str, ...] = PHASES, **options: object
              ) -> tuple[dict[str, dist.StepFn], MultVAE]:
    """The step of each phase (``MultVAE.PHASES``) on one model and optimizer."""
    # learning rate 1e-3: the rate the recordings below were made with (train's was 1e-3)
    config = TrainConfig(split="", output="", checkpoint_dir="", precision=precision,
                         hidden=16, latent=4,
                         **({"anneal_steps": 4, "l2": 0.01, "learning_rate": 1e-3} | options))
    model_options = {k: v for k, v in options.items()
                     if k in ("encoder_layers", "composite_prior")}
    model = MultVAE(N_ITEMS, hidden=16, latent=4, policy=config.keras_policy, seed=3,
                    item_chunk=item_chunk, **model_options)
    model.build_variables()
    optimizer = dist.make_optimizer(config)
    optimizer.build(model.trainable_variables)
    # "joint" as the code before the options was called (the recording runs it)
    return {phase: lone_step(model, optimizer, config, RUNTIME,
                                        *([phase] if phase != "joint" else []))
            for phase in phases}, model


def trajectory(precision: str, item_chunk: int | None) -> list[float]:
    """Five default steps: every statistic of every step, then each weight's sum."""
    steps, model = make_step(precision, item_chunk, ("joint",))
    stats = [steps["joint"](batch(seed=i), tf.constant(i, tf.int64)).numpy()
             for i in range(5)]
    return [float(x) for x in np.concatenate(stats)] + [
        float(np.sum(w.astype(np.float64))) for w in model.get_weights()]


# Recorded with the code before the options existed (9d96fc7), on this repository's CPU.
TODAY = {
    ("fp32", None): [
        14.9467926, 14.3201084, 0.179180682, 0, 0, 15.1950426, 14.5257692, 0.224131703,
        0.200000003, 0, 15.5482779, 14.8760471, 0.248747304, 0.200000003, 0, 15.9466896,
        15.2614794, 0.322820723, 0.200000003, 0, 15.1427555, 14.4715214, 0.261273026,
        0.200000003, 0, -4.51952506, 0.016885822, -1.45066809, -0.0147403313, 0.676956069,
        0.00436996427, -5.69342075, -0.0123721696],
    ("mixed_float16", None): [
        14.9465981, 14.3199139, 0.179210335, 0, 0, 15.1950188, 14.5257368, 0.224176928,
        0.200000003, 0, 15.5481453, 14.8759155, 0.248741791, 0.200000003, 0, 15.9463863,
        15.2611723, 0.32283181, 0.200000003, 0, 15.1428776, 14.4716549, 0.261212111, 0.200000003,
        0, -4.5195926, 0.0168790173, -1.45068633, -0.0147401978, 0.676953718, 0.00435806508,
        -5.69332222, -0.0123760089],
    ("mixed_bfloat16", None): [
        14.9456873, 14.3190031, 0.178009689, 0, 0, 15.1924839, 14.5235138, 0.22256282,
        0.200000003, 0, 15.5410938, 14.8692837, 0.246601179, 0.200000003, 0, 15.939558,
        15.2549801, 0.319617808, 0.200000003, 0, 15.1397619, 14.4688263, 0.259758264,
        0.200000003, 0, -4.52127747, 0.0168158287, -1.45099948, -0.0146791937, 0.676879011,
        0.00435207199, -5.69349617, -0.0123837394],
    ("fp32", 8): [
        14.9467926, 14.3201084, 0.179180682, 0, 0, 15.1950407, 14.5257673, 0.224131703,
        0.200000003, 0, 15.5482779, 14.8760471, 0.248747259, 0.200000003, 0, 15.9466906,
        15.2614803, 0.322820723, 0.200000003, 0, 15.1427555, 14.4715214, 0.261273026,
        0.200000003, 0, -4.51952504, 0.0168858212, -1.45066804, -0.0147403311, 0.676956087,
        0.00436996639, -5.69342071, -0.0123721719],
}


# oneDNN computes bfloat16 natively on some CPUs with bfloat16 units and emulates it elsewhere;
# the two round differently (up to 1% on these sums), and which one a CPU takes is not told by
# its flags alone (the recording above passed on CPUs this one, with AVX512-BF16, does not
# match). So bfloat16 has a second recording, and the step must equal one of the two: main
# d5aceb4 on a Xeon with AVX512-BF16, 2026-11-28, whose fp32 and mixed_float16 trajectories
# equal the recordings above.
TODAY_BF16_NATIVE = [
    14.9461422, 14.319458, 0.179611385, 0, 0, 15.1944771, 14.5252581, 0.223828435, 0.200000003,
    0, 15.5463533, 14.8741436, 0.248608947, 0.200000003, 0, 15.9472351, 15.2619982, 0.322914124,
    0.200000003, 0, 15.1417236, 14.4705706, 0.260831892, 0.200000003, 0, -4.52109023,
    0.0168553828, -1.45093611, -0.0147098884, 0.676803418, 0.00438882594, -5.69212478,
    -0.012389127]


@pytest.mark.parametrize(("precision", "item_chunk"), list(TODAY))
def test_options_off_are_the_step_as_it_was(precision: str, item_chunk: int | None) -> None:
    ours = np.array(trajectory(precision, item_chunk))
    recordings = [TODAY[precision, item_chunk]] + (
        [TODAY_BF16_NATIVE] if precision == "mixed_bfloat16" else [])
    if not any(np.allclose(ours, r, rtol=2e-5, atol=1e-6) for r in recordings):
        np.testing.assert_allclose(ours, recordings[0], rtol=2e-5, atol=1e-6)  # says where


# [loss, nll, kl, beta, val ndcg@100] of two epochs of `vaecf train` on the synthetic split,
# recorded as above, re-recorded when the split became keyed (split_keys): the same code on
# the split of earlier versions still gives [133.085358, 133.081192, 0.0930235535, ...].
TODAY_TRAIN_LOG = [
    [125.8312, 125.827354, 0.0860140994, 0.088888891, 0.164017847],
    [128.454437, 128.439865, 0.0931620449, 0.200000003, 0.198476621]]


def train_log(split: Path, output: Path, *flags: str) -> list[list[float]]:
    from vaecf.cli import main

    assert main(["train", "--split", str(split), "--output", str(output), "--epochs", "2",
                 "--batch-size", "100", "--hidden", "32", "--latent", "8", *flags]) == 0
    records = [json.loads(line) for line in
               (output / "train_log.jsonl").read_text().splitlines()]
    return [[r["loss"], r["nll"], r["kl"], r["beta"], r["val"]["ndcg_at_100"]]
            for r in records]


def test_vaecf_train_with_every_option_off_trains_as_it_did(synthetic_split, tmp_path: Path
                                                           ) -> None:
    # --encoder-layers 1: Mult-VAE's encoder (the default is RecVAE's 5, measured better);
    # --learning-rate 0.001: Mult-VAE's, which the recording was made with (train's is 5e-4)
    np.testing.assert_allclose(train_log(synthetic_split(), tmp_path / "model",
                                         "--encoder-layers", "1", "--learning-rate", "0.001"),
                               TODAY_TRAIN_LOG, rtol=2e-5)


def run(steps: dict[str, dist.StepFn], count: int = 3, phase: str = "joint") -> np.ndarray:
    return np.array([steps[phase](batch(seed=i), tf.constant(i, tf.int64)).numpy()
                     for i in range(count)])


def test_kl_per_item_is_beta_when_every_user_has_the_same_count() -> None:
    # Every user has 4 items: gamma = 0.05 weighs every KL term by 0.2, a fixed beta of 0.2.
    fixed, fixed_model = make_step(beta_cap=0.2, anneal_steps=0)
    per_item, per_item_model = make_step(kl_per_item=0.05)
    np.testing.assert_allclose(run(per_item), run(fixed), rtol=1e-5)
    for a, b in zip(per_item_model.get_weights(), fixed_model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_kl_per_item_weighs_each_user_by_its_count() -> None:
    from vaecf.train.horovod import kl_weight

    data = SparseBatch(tf.constant([0, 0, 0, 1, 1], tf.int64), tf.constant([1, 2, 3, 4, 0],
                                                                           tf.int64),
                       tf.constant([1.0, 1.0, 1.0, 1.0, 0.0]), tf.constant([7, 9], tf.int64))
    config = TrainConfig(split="", output="", checkpoint_dir="", kl_per_item=0.005)
    np.testing.assert_allclose(kl_weight(data, tf.constant(0), config).numpy(),
                               [0.015, 0.005])  # the padding entry (value 0) counts nothing


def test_composite_kl_matches_the_mixture_density_by_scipy() -> None:
    from vaecf.model.loss import composite_kl

    rng = np.random.default_rng(1)
    z, mu, old_mu = (rng.normal(size=(3, 2)) for _ in range(3))
    logvar, old_logvar = rng.normal(size=(3, 2)) * 0.5, rng.normal(size=(3, 2)) * 0.5
    prior = (0.15 * norm.pdf(z) + 0.75 * norm.pdf(z, old_mu, np.exp(0.5 * old_logvar))
             + 0.1 * norm.pdf(z, 0.0, math.exp(5.0)))
    expected = (norm.logpdf(z, mu, np.exp(0.5 * logvar)) - np.log(prior)).sum(axis=1)
    got = composite_kl(*(tf.constant(a, tf.float32) for a in (z, mu, logvar, old_mu,
                                                              old_logvar)))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5)


def test_composite_prior_reads_the_frozen_encoder_which_follows_update_prior() -> None:
    step, model = make_step(composite_prior=True)
    frozen = [v.numpy().copy() for v in model.prior_variables()]
    run(step)
    assert model.prior_variables() and not any(v.trainable for v in model.prior_variables())
    for old, now in zip(frozen, model.prior_variables(), strict=True):
        np.testing.assert_array_equal(old, now.numpy())  # training never moves it
    model.update_prior()
    for mine, encoder in zip(model.prior_variables(), model.encoder_layers().variables(),
                             strict=True):
        np.testing.assert_array_equal(mine.numpy(), encoder.numpy())
    data = batch()
    _, mu, logvar = model.likelihood(data, training=False)
    old_mu, old_logvar = model._old_posterior(data)
    np.testing.assert_allclose(old_mu, mu, rtol=1e-6)  # the copy encodes as the encoder
    np.testing.assert_allclose(old_logvar, logvar, rtol=1e-6)


@pytest.mark.parametrize("phase", ["encoder", "decoder"])
def test_an_alternating_pass_changes_only_its_half(phase: str) -> None:
    step, model = make_step(**OPTIONS)
    before = {id(v): v.numpy().copy() for v in model.variables}
    run(step, phase=phase)
    moved = {id(v) for v in model.variables if not np.array_equal(before[id(v)], v.numpy())}
    assert moved == {id(v) for v in model.phase_variables(phase)}
    assert moved  # and the step did change them


def test_the_decoder_pass_drops_no_input() -> None:
    data = batch()
    dropped, undropped = (MultVAE(N_ITEMS, hidden=16, latent=4, seed=3, dropout=rate)
                          for rate in (0.5, 0.0))
    for model in (dropped, undropped):
        model.build_variables()
    nll, _, _ = dropped.likelihood(data, training=True, step=3, drop=False)
    expected, _, _ = undropped.likelihood(data, training=True, step=3)
    np.testing.assert_allclose(nll.numpy(), expected.numpy(), rtol=1e-6)
    with_dropout, _, _ = dropped.likelihood(data, training=True, step=3)
    assert not np.allclose(with_dropout.numpy(), expected.numpy())


@pytest.mark.parametrize("precision", ["fp32", "mixed_float16", "mixed_bfloat16"])
def test_every_option_trains_in_each_precision_chunked_as_whole(precision: str) -> None:
    results = []
    for chunk in (None, 8):
        step, model = make_step(precision, chunk, **OPTIONS)
        stats = np.concatenate([run(step, 2, phase) for phase in ("joint", "encoder",
                                                                  "decoder")])
        assert np.isfinite(stats).all()
        results.append((stats, model.get_weights()))
    (whole, whole_weights), (chunked, chunked_weights) = results
    tolerance = 1e-5 if precision == "fp32" else 2e-2
    np.testing.assert_allclose(chunked, whole, rtol=tolerance)
    for a, b in zip(chunked_weights, whole_weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=tolerance, atol=tolerance)


def test_the_deep_encoder_is_recvaes_residual_stack() -> None:
    model = MultVAE(N_ITEMS, hidden=6, latent=2, seed=1, encoder_layers=3)
    model.build_variables()
    data = batch(users=2)
    _, mu, logvar = model(data, training=False)
    x = np.zeros((2, model.n_padded), np.float32)
    x[data.rows.numpy(), data.item_idx.numpy()] = 1.0
    x /= np.linalg.norm(x, axis=1, keepdims=True)

    def layer_norm(h: np.ndarray, layer: object) -> np.ndarray:
        centred = h - h.mean(axis=1, keepdims=True)
        scaled = centred / np.sqrt(centred.var(axis=1, keepdims=True) + 0.1)
        return scaled * layer.gamma.numpy() + layer.beta.numpy()

    def swish(h: np.ndarray) -> np.ndarray:
        return h / (1.0 + np.exp(-h))

    first = model.encoder_hidden
    h = [layer_norm(swish(x @ first.kernel.numpy() + first.bias.numpy()),
                    model.encoder_norms[0])]
    for block, norm_layer in zip(model.encoder_blocks, model.encoder_norms[1:], strict=True):
        h.append(layer_norm(swish(h[-1] @ block.kernel.numpy() + block.bias.numpy()
                                  + sum(h)), norm_layer))
    stats = h[-1] @ model.encoder_out.kernel.numpy() + model.encoder_out.bias.numpy()
    np.testing.assert_allclose(mu.numpy(), stats[:, :2], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(logvar.numpy(), stats[:, 2:], rtol=1e-4, atol=1e-5)


def test_the_exported_model_of_every_option_serves_the_same_signatures(tmp_path: Path) -> None:
    from vaecf.train.export import export

    train = sp.random(20, N_ITEMS, density=0.2, format="csr", random_state=0)
    train.data[:] = 1.0
    ids = np.arange(N_ITEMS) + 100
    _, plain = make_step()
    export(plain.get_weights(), n_items=N_ITEMS, hidden=16, latent=4, path=tmp_path / "plain",
           item_ids=ids, popularity=Popularity(train).counts)
    _, model = make_step(**OPTIONS)
    frozen = {id(v) for v in model.prior_variables()}
    weights = [w for v, w in zip(model.weights, model.get_weights(), strict=True)
               if id(v) not in frozen]
    export(weights, n_items=N_ITEMS, hidden=16, latent=4, encoder_layers=3,
           path=tmp_path / "deep", item_ids=ids, popularity=Popularity(train).counts)
    plain_loaded, deep_loaded = (tf.saved_model.load(str(tmp_path / name))
                                 for name in ("plain", "deep"))
    for name, signature in plain_loaded.signatures.items():
        other = deep_loaded.signatures[name]
        assert other.structured_input_signature == signature.structured_input_signature
        assert other.structured_outputs == signature.structured_outputs
    data = batch(users=2)
    splits = tf.constant([0, 4, 8], tf.int64)
    scores = deep_loaded.signatures["score"](row_splits=splits, item_idx=data.item_idx)
    logits, _, _ = model(data, training=False)
    np.testing.assert_allclose(scores["scores"].numpy(), logits.numpy()[:, :N_ITEMS],
                               rtol=1e-5, atol=1e-5)


def implicit_slim_reference(w: np.ndarray, x: np.ndarray, lam: float, alpha: float,
                            threshold: int) -> np.ndarray:
    """ImplicitSLIM as its authors write it, with the [items, items] matrix X^T X formed."""
    a = w.copy()
    counts = x.sum(axis=0)
    a[:, counts < threshold] = 0.0
    d = 1.0 / (counts + lam)
    gram = x.T @ x
    m = (lam * a + a @ gram) * d * d
    c = lam * m + m @ gram
    k = c @ a.T
    return alpha * w @ a.T @ (c - k @ np.linalg.inv(np.eye(len(w)) / alpha + k) @ c)


def test_implicit_slim_matches_the_formula_with_the_item_gram_matrix() -> None:
    from vaecf.model.implicit_slim import embeddings, products

    rng = np.random.default_rng(2)
    x = (rng.random((30, 12)) < 0.3).astype(np.float64)
    w = rng.normal(size=(4, 12))
    got = embeddings(w, *products(sp.csr_matrix(x), [slice(0, 12)], 0), 5.0, 0.7, 3)
    np.testing.assert_allclose(got, implicit_slim_reference(w, x, 5.0, 0.7, 3), rtol=1e-9)
    assert not np.allclose(got, w)


@pytest.mark.parametrize("item_shards", [False, True], ids=["replicated", "shard-items"])
def test_implicit_slim_by_user_shares_is_the_whole(item_shards: bool) -> None:
    """Two processes, each holding its share of the users' rows (and with ``--shard-items``
    its half of the items), summing their partial sums with the other's (Horovod's
    allreduce) and taking each other's shard of ``Y`` (its broadcast), give the whole
    computation's columns."""
    from vaecf.model.implicit_slim import alone, embeddings, products

    rng = np.random.default_rng(3)
    x = sp.csr_matrix((rng.random((25, 16)) < 0.3).astype(np.float32))
    w = rng.normal(size=(5, 16)).astype(np.float32)
    whole = embeddings(w, *products(x, [slice(0, 16)], 0), 4.0, 1.0, 2)
    barrier, shared = threading.Barrier(2), [None, None]
    results: list[np.ndarray | None] = [None, None]

    def exchange(rank: int, value: np.ndarray) -> list[np.ndarray]:
        shared[rank] = value
        barrier.wait()
        both = list(shared)
        barrier.wait()
        return both

    def process(rank: int) -> None:
        def sum_over(value: np.ndarray) -> np.ndarray:
            first, second = exchange(rank, value)
            return first + second

        def broadcast(value: np.ndarray, root: int) -> np.ndarray:
            return exchange(rank, value)[root]

        users = slice(0, 12) if rank == 0 else slice(12, 25)  # unequal shares
        shards = [slice(0, 8), slice(8, 16)] if item_shards else [slice(0, 16)]
        mine = rank if item_shards else 0
        counts, cooccur = products(x[users], shards, mine, sum_over, broadcast)
        results[rank] = embeddings(w[:, shards[mine]], counts, cooccur, 4.0, 1.0, 2,
                                   sum_over if item_shards else alone)

    threads = [threading.Thread(target=process, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    got = np.concatenate(results, axis=1) if item_shards else results[0]
    np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-6)
    if not item_shards:
        np.testing.assert_array_equal(results[1], results[0])


def test_vaecf_train_with_every_option_exports_a_model_evaluate_reads(
        synthetic_split, tmp_path: Path) -> None:
    from vaecf.cli import main

    split = synthetic_split()
    log = train_log(split, tmp_path / "model", "--kl-per-item", "0.005", "--composite-prior",
                    "--alternate", "2", "--encoder-layers", "3", "--implicit-slim-every", "1")
    assert len(log) == 2 and np.isfinite(log).all()
    manifest = json.loads((tmp_path / "model" / "train_manifest.json").read_text())
    assert manifest["parameters"]["alternate"] == 2
    assert manifest["counts"]["steps"] == 2 * 3 * 5  # 2 epochs x 3 passes x 500 users / 100
    assert main(["evaluate", "--split", str(split), "--model", str(tmp_path / "model"),
                 "--output", str(tmp_path / "eval")]) == 0
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert 0.0 < metrics["ndcg_at_100"]["mean"] <= 1.0


if __name__ == "__main__":  # print the recorded trajectories (see the module docstring)
    import sys
    import tempfile

    from vaecf.cli import build_parser
    from vaecf.data.split import write_synthetic_split

    for key in TODAY:
        print(key, trajectory(*key))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "split").mkdir()
        write_synthetic_split(Path(tmp) / "split", 600, 300, 0, mean_items=40.0)
        print("train log", train_log(Path(tmp) / "split", Path(tmp) / "model",
                                     *(["--encoder-layers", "1"] if "--encoder-layers" in
                                       build_parser("train").format_help() else [])))
    sys.exit(0)
