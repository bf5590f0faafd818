"""Mult-VAE model, objective and noise: hand-computed values and the properties training needs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from vaecf.model import (
    MultVAE,
    SparseBatch,
    beta_at,
    gaussian_kl,
    l2_penalty,
    multinomial_nll,
    noise,
    padded_items,
)


def batch(rows: list[int], items: list[int], users: list[int],
          values: list[float] | None = None) -> SparseBatch:
    return SparseBatch(tf.constant(rows, tf.int64), tf.constant(items, tf.int64),
                       tf.constant(values or [1.0] * len(rows), tf.float32),
                       tf.constant(users, tf.int64))


def test_multinomial_nll_matches_hand_computed_log_softmax() -> None:
    logits = tf.constant([[0.0, math.log(2.0), math.log(5.0)], [1.0, 1.0, 1.0]])
    # user 0 has items 1 and 2: -(log 2/8 + log 5/8); user 1 has item 0: -log 1/3
    # the trailing entry is padding (value 0) and must not count
    nll = multinomial_nll(logits, batch([0, 0, 1, 0], [1, 2, 0, 0], [7, 8],
                                        [1.0, 1.0, 1.0, 0.0]))
    expected = [-(math.log(2 / 8) + math.log(5 / 8)), math.log(3.0)]
    np.testing.assert_allclose(nll.numpy(), expected, rtol=1e-6)


def test_gaussian_kl_hand_computed() -> None:
    mu = tf.constant([[0.0, 0.0], [1.0, -2.0]])
    logvar = tf.constant([[0.0, 0.0], [0.0, math.log(2.0)]])
    # 0.5 * (e^lv + mu^2 - 1 - lv): row 1 = 0.5*(1+1-1-0) + 0.5*(2+4-1-ln 2)
    expected = [0.0, 0.5 + 0.5 * (5.0 - math.log(2.0))]
    np.testing.assert_allclose(gaussian_kl(mu, logvar).numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize(("step", "cap", "steps", "expected"),
                         [(0, 0.2, 100, 0.0), (10, 0.2, 100, 0.1), (50, 0.2, 100, 0.2),
                          (7, 0.3, 0, 0.3)])
def test_beta_annealing(step: int, cap: float, steps: int, expected: float) -> None:
    assert float(beta_at(step, cap, steps)) == pytest.approx(expected)


def test_l2_penalty_is_sum_of_squares_times_l2() -> None:
    kernels = [tf.constant([[1.0, 2.0]]), tf.constant([3.0])]
    assert float(l2_penalty(kernels, 0.5)) == pytest.approx(0.5 * 14.0)
    assert float(l2_penalty(kernels, 0.0)) == 0.0


def test_padded_items_and_padding_takes_no_probability() -> None:
    assert [padded_items(n) for n in (1, 8, 21, 20108)] == [8, 8, 24, 20112]
    model = MultVAE(21, hidden=8, latent=4, seed=1)
    logits, _, _ = model(batch([0], [3], [0]), training=False)
    assert logits.shape == (1, 24)
    probabilities = tf.nn.softmax(logits).numpy()
    assert probabilities[0, 21:].max() == 0.0
    assert probabilities[0, :21].sum() == pytest.approx(1.0, abs=1e-6)


def test_paper_initialisation_and_identical_seeded_replicas() -> None:
    first, second = MultVAE(100, hidden=16, latent=4, seed=3), MultVAE(100, hidden=16,
                                                                       latent=4, seed=3)
    first.build_variables()
    second.build_variables()
    for a, b in zip(first.get_weights(), second.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)  # every Horovod rank starts from the same point
    kernel, bias = first.encoder_hidden.kernel.numpy(), first.encoder_hidden.bias.numpy()
    limit = math.sqrt(6.0 / (104 + 16))  # Glorot uniform over the padded 104 inputs
    assert np.abs(kernel).max() <= limit and np.abs(kernel).max() > 0.8 * limit
    assert 0 < np.abs(bias).max() <= 0.002  # truncated normal, stddev 0.001 (not zeros)


def test_noise_depends_on_user_not_on_batch_position() -> None:
    """The same user gets the same dropout mask and epsilon wherever it sits in a batch."""
    step = tf.constant(5, tf.int64)
    alone = noise.normal(0, step, tf.constant([42], tf.int64), 6).numpy()
    among = noise.normal(0, step, tf.constant([7, 42, 9], tf.int64), 6).numpy()
    # equal up to the last bit of vectorised log/cos, which depends on the array length
    np.testing.assert_allclose(alone[0], among[1], rtol=1e-6, atol=1e-7)
    assert not np.allclose(among[0], among[1])
    later = noise.normal(0, step + 1, tf.constant([42], tf.int64), 6).numpy()
    assert not np.allclose(alone, later)
    uniforms = noise.uniform(0, 1, step, tf.range(20_000, dtype=tf.int64)).numpy()
    assert uniforms.min() > 0.0 and uniforms.max() < 1.0
    assert uniforms.mean() == pytest.approx(0.5, abs=0.01)


def test_normal_noise_is_box_muller_of_the_even_and_odd_uniform_columns() -> None:
    step, users = tf.constant(3, tf.int64), tf.constant([[4], [11]], tf.int64)
    column = tf.range(5, dtype=tf.int64)[tf.newaxis, :]
    u1 = noise.uniform(2, noise.STREAM_EPSILON, step, users, 2 * column).numpy()
    u2 = noise.uniform(2, noise.STREAM_EPSILON, step, users, 2 * column + 1).numpy()
    expected = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)
    got = noise.normal(2, step, tf.constant([4, 11], tf.int64), 5).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_training_forward_is_noisy_inference_is_not() -> None:
    model = MultVAE(30, hidden=8, latent=4, seed=0)
    data = batch([0, 0, 1], [1, 2, 5], [0, 1])
    infer = [model(data, training=False)[0].numpy() for _ in range(2)]
    np.testing.assert_array_equal(infer[0], infer[1])
    train = model(data, training=True, step=tf.constant(0, tf.int64))[0].numpy()
    assert not np.allclose(train, infer[0])


def test_mixed_bfloat16_keeps_logits_and_statistics_float32() -> None:
    model = MultVAE(30, hidden=8, latent=4, policy="mixed_bfloat16")
    logits, mu, logvar = model(batch([0], [1], [0]), training=True,
                               step=tf.constant(0, tf.int64))
    assert logits.dtype == mu.dtype == logvar.dtype == tf.float32
    assert model.decoder_out.compute_dtype == "bfloat16"
    assert model.decoder_out.kernel.dtype == "float32"


def test_hand_written_nll_gradient_matches_automatic_differentiation() -> None:
    rng = np.random.default_rng(0)
    logits = tf.constant(rng.normal(size=(3, 10)) * 3, tf.float32)
    data = batch([0, 0, 1, 2, 2, 2, 0], [1, 4, 9, 0, 2, 3, 0], [5, 6, 7],
                 [1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 0.0])
    weights = tf.constant([0.5, -1.0, 2.0])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        ours = tf.reduce_sum(weights * multinomial_nll(logits, data))
        dense = tf.scatter_nd(tf.stack([data.rows, data.item_idx], 1), data.values, [3, 10])
        reference = tf.reduce_sum(weights * -tf.reduce_sum(dense * tf.nn.log_softmax(logits), 1))
    np.testing.assert_allclose(float(ours), float(reference), rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(ours, logits).numpy(),
                               tape.gradient(reference, logits).numpy(), atol=1e-6)


@pytest.mark.parametrize("form", ["dense", "segment"])
def test_every_first_layer_form_computes_the_cpu_product_and_its_gradient(form: str) -> None:
    """The GPU's dense form and XLA's segment form against the CPU's two-halves sparse
    product, with padding entries (value 0, repeated at the last row) and an empty user."""
    rng = np.random.default_rng(4)
    rows = [0, 0, 0, 1, 3, 3, 3, 3, 3]  # user 2 has no items
    items = [1, 7, 29, 5, 2, 3, 11, 0, 0]
    values = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    data = batch(rows, items, [10, 11, 12, 13], values)
    results = []
    for name in ("halves", form):
        model = MultVAE(30, hidden=8, latent=4, seed=2, first_layer=name)
        model.build_variables()
        assert model.encoder_hidden.form == name
        with tf.GradientTape() as tape:
            logits, mu, logvar = model(data, training=True, step=tf.constant(4, tf.int64))
            loss = tf.reduce_sum(tf.constant(rng.normal(size=logits.shape), tf.float32) *
                                 logits) + tf.reduce_sum(mu * logvar)
        grads = tape.gradient(loss, model.trainable_variables)
        results.append([logits, mu, logvar, *[tf.convert_to_tensor(g) for g in grads]])
        rng = np.random.default_rng(4)  # the same weighting for both forms
    for a, b in zip(*results, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)
    assert np.abs(results[0][3].numpy()).sum() > 0  # the first layer's kernel gets a gradient


def test_the_first_layer_form_follows_the_host() -> None:
    assert MultVAE(30, hidden=8, latent=4, xla=True).encoder_hidden.form == "segment"
    expected = "dense" if tf.config.list_logical_devices("GPU") else "halves"
    assert MultVAE(30, hidden=8, latent=4).encoder_hidden.form == expected
    with pytest.raises(ValueError, match="first layer form 'sparse'"):
        MultVAE(30, hidden=8, latent=4, first_layer="sparse")


@pytest.mark.parametrize(("epochs", "steps", "cap"), [(3, 6, 0.2), (100, 7, 0.2), (1, 1, 0.5),
                                                      (200, 234, 0.2)])
def test_default_annealing_reaches_the_cap_at_the_last_step(epochs: int, steps: int,
                                                           cap: float) -> None:
    from vaecf.train.config import TrainConfig

    config = TrainConfig("split", "out", "ckpt", epochs=epochs, beta_cap=cap).resolved(steps)
    assert config.anneal_steps is not None
    last = epochs * steps - 1  # the step index of the run's last update
    assert float(beta_at(last, cap, config.anneal_steps)) == pytest.approx(cap)
    if last > 0:
        assert float(beta_at(last - 1, cap, config.anneal_steps)) < cap
    assert TrainConfig("s", "o", "c", anneal_steps=200_000).resolved(steps).anneal_steps == 200_000
