"""The chunked likelihood equals the whole-logits one (values and gradients, float32)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from single_steps import lone_step

from vaecf.model import MultVAE, SparseBatch, choose_item_chunk, multinomial_nll
from vaecf.model.loss import chunked_nll
from vaecf.train import horovod as dist
from vaecf.train.config import TrainConfig

# float32 sums over a few dozen items in another order: a few ulps of the loss.
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


def random_batch(rng: np.random.Generator, users: int, items: int) -> SparseBatch:
    rows = np.repeat(np.arange(users), 4)
    values = np.ones(rows.size, np.float32)
    values[-3:] = 0.0  # padding entries
    values[0] = 2.0  # a repeated interaction
    return SparseBatch(tf.constant(rows, tf.int64), tf.constant(rng.integers(0, items, rows.size)),
                       tf.constant(values), tf.range(users, dtype=tf.int64))


@pytest.mark.parametrize("chunk", [1, 7, 16, 48, 100])
@pytest.mark.parametrize("compiled", [False, True])
def test_chunked_nll_and_gradients_equal_the_whole_softmax(chunk: int, compiled: bool) -> None:
    rng = np.random.default_rng(chunk)
    users, items, padded, width = 6, 45, 48, 5
    hidden = tf.constant(rng.normal(size=(users, width)), tf.float32)
    kernel = tf.constant(rng.normal(size=(width, padded)), tf.float32)
    bias = tf.where(tf.range(padded) >= items, tf.float32.min,
                    tf.constant(rng.normal(size=padded), tf.float32))
    data = random_batch(rng, users, items)
    upstream = tf.constant(rng.normal(size=users), tf.float32)

    def run(chunked: bool) -> list[np.ndarray]:
        with tf.GradientTape() as tape:
            tape.watch([hidden, kernel, bias])
            if chunked:
                nll = chunked_nll(hidden, kernel, bias, data, chunk)
            else:
                nll = multinomial_nll(tf.matmul(hidden, kernel) + bias, data)
            total = tf.reduce_sum(upstream * nll)
        return [nll, *tape.gradient(total, [hidden, kernel, bias])]

    chunked = tf.function(run, jit_compile=True)(True) if compiled else run(True)
    for ours, reference in zip(chunked, run(False), strict=True):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(reference), **TOLERANCE)


def test_chunked_model_steps_like_the_whole_softmax() -> None:
    """Three Adam steps of the chunked model give the unchunked model's losses and weights."""
    config = TrainConfig(split="", output="", checkpoint_dir="", hidden=16, latent=4,
                         anneal_steps=3)
    runtime = dist.Runtime(rank=0, size=1, local_rank=0, hosts=1, hvd=None)
    data = random_batch(np.random.default_rng(1), 5, 37)
    results = []
    for chunk in (None, 8):
        model = MultVAE(37, hidden=16, latent=4, item_chunk=chunk)
        model.build_variables()
        optimizer = dist.make_optimizer(config)
        optimizer.build(model.trainable_variables)
        step = lone_step(model, optimizer, config, runtime)
        losses = [step(data, tf.constant(i, tf.int64))[0].numpy() for i in range(3)]
        results.append((losses, model.get_weights()))
    (whole_losses, whole), (chunk_losses, chunked) = results
    np.testing.assert_allclose(chunk_losses, whole_losses, **TOLERANCE)
    for ours, reference in zip(chunked, whole, strict=True):
        np.testing.assert_allclose(ours, reference, **TOLERANCE)


def test_chunked_likelihood_stays_float32_under_mixed_precision() -> None:
    data = random_batch(np.random.default_rng(2), 4, 30)
    whole, chunked = (MultVAE(30, hidden=8, latent=4, policy="mixed_bfloat16", item_chunk=c)
                      for c in (None, 8))
    chunked.build_variables()
    whole.build_variables()
    chunked.set_weights(whole.get_weights())
    ours, reference = chunked.likelihood(data)[0], whole.likelihood(data)[0]
    assert ours.dtype == tf.float32
    np.testing.assert_allclose(ours.numpy(), reference.numpy(), rtol=2e-2)  # bfloat16 matmul


def test_item_chunk_is_chosen_by_the_size_of_the_logits() -> None:
    assert choose_item_chunk(500, 20_008, None) is None  # 40 MB of logits: whole
    assert choose_item_chunk(1024, 1_000_000, None) == (64 << 20) // (4 * 1024)
    assert choose_item_chunk(1024, 1_000_000, 0) is None  # --item-chunk 0
    assert choose_item_chunk(1024, 64, 4096) == 4096  # --item-chunk N as given


def test_a_gpu_keeps_the_whole_logits_of_a_large_batch() -> None:
    # One H100, fp32, no --xla: 16,384 users x 20,096 items chunked ran 4.3x slower per user
    # than 4,096 users whole; the same batch on a CPU is chunked (1.3 GB of logits).
    assert choose_item_chunk(16_384, 20_096, None, "GPU") is None
    assert choose_item_chunk(16_384, 20_096, None, "CPU") == (64 << 20) // (4 * 16_384)
    assert choose_item_chunk(16_384, 1_000_000, None, "GPU") == (64 << 20) // (4 * 16_384)
