"""The training step's float16 path: an overflow is skipped and the loss scale halves."""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import pytest
import tensorflow as tf
from single_steps import lone_step

from vaecf.model import MultVAE, SparseBatch
from vaecf.train import horovod as dist
from vaecf.train.config import TrainConfig
from vaecf.train.optimizer import FusedAdam, SkippingLossScale


def run_steps(optimizer: keras.optimizers.Optimizer, steps: int) -> tuple[list[bool], MultVAE,
                                                                          list[np.ndarray]]:
    config = TrainConfig(split="", output="", checkpoint_dir="", precision="mixed_float16",
                         hidden=16, latent=4, anneal_steps=0)
    model = MultVAE(40, hidden=16, latent=4, policy="mixed_float16")
    model.build_variables()
    optimizer.build(model.trainable_variables)
    before = [w.copy() for w in model.get_weights()]
    runtime = dist.Runtime(rank=0, size=1, local_rank=0, hosts=1, hvd=None)
    step = lone_step(model, optimizer, config, runtime)
    batch = SparseBatch(tf.constant([0, 0, 1], tf.int64), tf.constant([1, 5, 7], tf.int64),
                        tf.ones([3]), tf.constant([0, 1], tf.int64))
    finite = [step(batch, tf.constant(i, tf.int64)).numpy()[4] == 0.0 for i in range(steps)]
    return finite, model, before


def keras_scaling() -> keras.optimizers.LossScaleOptimizer:
    return keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3),
                                               initial_scale=2.0 ** 40)


def skipping_scaling() -> keras.optimizers.LossScaleOptimizer:
    return SkippingLossScale(FusedAdam(1e-3), initial_scale=2.0 ** 40)


SCALINGS = pytest.mark.parametrize("make", [keras_scaling, skipping_scaling])


@SCALINGS
def test_overflowing_float16_step_is_skipped_and_the_scale_halves(make) -> None:
    # A loss scale of 2**40 overflows float16 gradients (max 65504) whatever the batch.
    optimizer = make()
    finite, model, before = run_steps(optimizer, 1)
    assert finite == [False]
    assert float(optimizer.dynamic_scale.numpy()) == 2.0 ** 39
    assert int(optimizer.inner_optimizer.iterations.numpy()) == 0
    for old, new in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(old, new)  # the skipped step changed nothing


@SCALINGS
def test_scale_falls_until_steps_apply(make) -> None:
    optimizer = make()
    finite, model, before = run_steps(optimizer, 40)
    skipped = finite.count(False)
    assert not finite[0] and finite[-1] and 20 <= skipped < 40
    assert float(optimizer.dynamic_scale.numpy()) == 2.0 ** (40 - skipped)  # halved per skip
    assert int(optimizer.inner_optimizer.iterations.numpy()) == 40 - skipped
    assert not np.array_equal(before[-1], model.get_weights()[-1])


def compiled_apply(optimizer: keras.optimizers.Optimizer, variables: list) -> Callable:
    @tf.function
    def apply(grads: list) -> None:
        optimizer.apply(grads, variables)

    return apply


def test_fused_adam_matches_keras_adam_with_one_set_of_scalars() -> None:
    rng = np.random.default_rng(0)
    start = [rng.normal(size=shape).astype(np.float32) for shape in ((5, 3), (3,), (3, 2))]
    results = []
    for optimizer in (keras.optimizers.Adam(1e-2), FusedAdam(1e-2)):
        variables = [keras.Variable(value) for value in start]
        optimizer.build(variables)
        apply = compiled_apply(optimizer, variables)
        for i in range(3):
            apply([tf.constant(np.sin(value * (i + 1))) for value in start])
        results.append([v.numpy() for v in variables])
        graph = apply.get_concrete_function(
            [tf.TensorSpec(value.shape) for value in start]).graph.as_graph_def()
        ops = [n.op for f in graph.library.function for n in f.node_def] + [
            n.op for n in graph.node]
        if isinstance(optimizer, FusedAdam):
            assert ops.count("ResourceApplyAdam") == 3 and ops.count("Pow") == 2
    for keras_value, fused_value in zip(*results, strict=True):
        np.testing.assert_allclose(fused_value, keras_value, rtol=1e-5, atol=1e-6)


def test_skipping_scale_matches_keras_step_for_step_without_a_conditional() -> None:
    config = TrainConfig(split="", output="", checkpoint_dir="", precision="mixed_float16",
                         hidden=16, latent=4, anneal_steps=0)
    runs = []
    for make in (lambda: keras.optimizers.LossScaleOptimizer(
            FusedAdam(1e-3), initial_scale=2.0 ** 20, dynamic_growth_steps=3), lambda:
            SkippingLossScale(FusedAdam(1e-3), initial_scale=2.0 ** 20, dynamic_growth_steps=3)):
        optimizer = make()
        model = MultVAE(40, hidden=16, latent=4, policy="mixed_float16")
        model.build_variables()
        optimizer.build(model.trainable_variables)
        runtime = dist.Runtime(rank=0, size=1, local_rank=0, hosts=1, hvd=None)
        step = lone_step(model, optimizer, config, runtime)
        batch = SparseBatch(tf.constant([0, 0, 1], tf.int64), tf.constant([1, 5, 7], tf.int64),
                            tf.ones([3]), tf.constant([0, 1], tf.int64))
        stats = [step(batch, tf.constant(i, tf.int64)).numpy() for i in range(12)]
        graph = step.get_concrete_function(batch, tf.constant(0, tf.int64)).graph.as_graph_def()
        ops = {n.op for f in graph.library.function for n in f.node_def} | {
            n.op for n in graph.node}
        runs.append((stats, [w.copy() for w in model.get_weights()],
                     float(optimizer.dynamic_scale.numpy()),
                     int(optimizer.inner_optimizer.iterations.numpy()), ops))
    (keras_stats, keras_weights, keras_scale, keras_steps, keras_ops), ours = runs[0], runs[1]
    assert {"If", "StatelessIf"} & keras_ops and not {"If", "StatelessIf"} & ours[4]
    assert sum(s[4] for s in keras_stats) > 0 and keras_scale != 2.0 ** 20  # skips and growth
    np.testing.assert_allclose(np.array(ours[0]), np.array(keras_stats), rtol=1e-5, atol=1e-6)
    for a, b in zip(ours[1], keras_weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert (ours[2], ours[3]) == (keras_scale, keras_steps)
