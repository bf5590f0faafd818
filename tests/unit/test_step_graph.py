"""The traced training step: no slow half-precision reductions, and --xla compiles all of it."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from single_steps import lone_step

from vaecf.model import MultVAE, SparseBatch
from vaecf.train import horovod as dist
from vaecf.train.config import TrainConfig

# Ops whose float16/bfloat16 kernels are slow on an H100 (DESIGN.md section 8): they must see
# only float32 inside the step, forward or gradient.
SLOW_IN_HALF = ("Scatter", "SegmentSum", "SegmentMean", "SegmentMax", "SegmentProd",
                "BiasAddGrad", "BiasAdd", "SparseTensorDenseMatMul")
HALF = {tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum}
N_ITEMS = 37


def make_step(precision: str, xla: bool) -> tuple[dist.StepFn, MultVAE]:
    config = TrainConfig(split="", output="", checkpoint_dir="", precision=precision,
                         hidden=16, latent=4, anneal_steps=10, xla=xla, l2=0.01)
    model = MultVAE(N_ITEMS, hidden=16, latent=4, policy=config.keras_policy, seed=3, xla=xla)
    model.build_variables()
    optimizer = dist.make_optimizer(config)
    optimizer.build(model.trainable_variables)
    runtime = dist.Runtime(rank=0, size=1, local_rank=0, hosts=1, hvd=None)
    return lone_step(model, optimizer, config, runtime), model


def batch(users: int = 5, seed: int = 0) -> SparseBatch:
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(users), 4)
    items = np.concatenate([rng.choice(N_ITEMS, 4, replace=False) for _ in range(users)])
    return SparseBatch(tf.constant(rows, tf.int64), tf.constant(items, tf.int64),
                       tf.ones([rows.size]), tf.range(users, dtype=tf.int64))


def graph_nodes(step: dist.StepFn, data: SparseBatch) -> list[tf.compat.v1.NodeDef]:
    """Every node of the traced step, including those of the functions it calls."""
    graph = step.get_concrete_function(data, tf.constant(0, tf.int64)).graph.as_graph_def()
    nodes = list(graph.node)
    for function in graph.library.function:
        nodes.extend(function.node_def)
    return nodes


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("xla", [False, True])
def test_no_scatter_segment_or_bias_grad_runs_in_half_precision(precision: str,
                                                                xla: bool) -> None:
    step, _ = make_step(precision, xla)
    nodes = graph_nodes(step, batch())
    half = {node.op for node in nodes
            if any(value.type in HALF for value in node.attr.values())}
    assert "MatMul" in half  # the check sees the gradient graph and the half-precision ops
    assert {"Scatter", "SegmentSum"} & {op for node in nodes for op in SLOW_IN_HALF
                                        if op in node.op}  # ... and the reductions
    slow = sorted(op for op in half if any(name in op for name in SLOW_IN_HALF))
    assert slow == [], f"{precision}: {slow} run in float16/bfloat16"


@pytest.mark.parametrize("precision", ["fp32", "mixed_float16", "mixed_bfloat16"])
def test_whole_step_compiles_under_xla(precision: str) -> None:
    step, _ = make_step(precision, xla=True)
    data = batch()
    ops = {node.op for node in graph_nodes(step, data)}
    assert "SparseTensorDenseMatMul" not in ops  # XLA has no kernel for it
    for i in range(3):
        stats = step(data, tf.constant(i, tf.int64))  # raises if XLA cannot compile
        assert np.isfinite(stats.numpy()).all()
    # experimental_get_compiler_ir fails unless the whole function is one XLA computation.
    hlo = step.experimental_get_compiler_ir(data, tf.constant(3, tf.int64))(stage="hlo")
    assert "scatter" in hlo and "dot" in hlo  # the loss gradient and the matmuls are inside
    if precision == "mixed_float16":
        assert "is-finite" in hlo  # the loss scaling's overflow check is compiled too


def test_xla_step_matches_the_plain_step_in_fp32() -> None:
    (plain, plain_model), (compiled, compiled_model) = (make_step("fp32", xla)
                                                        for xla in (False, True))
    for i in range(3):
        data = batch(seed=i)
        a = plain(data, tf.constant(i, tf.int64))
        b = compiled(data, tf.constant(i, tf.int64))
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)
    for a, b in zip(plain_model.get_weights(), compiled_model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
