"""The graphs a GPU runs, traced on any host, and their ops' needs from the GPU kernel registry.

Shared by ``record_gpu_kernels.py`` (run by hand with TensorFlow's CUDA build, it writes what
the GPU build's registry says about each (op, dtypes) of these graphs into
``gpu_kernels.json``) and ``test_gpu_kernels.py`` (CI, tensorflow-cpu: every (op, dtypes) of
the graphs must be in the fixture with a GPU kernel, and no host-memory input of a GPU kernel
may be computed on the device, which would make the host wait for the device mid-step).
A node placed on the CPU explicitly (``tf.device("/CPU:0")``) is host work by design: it
needs no GPU kernel and its outputs are host values.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import scipy.sparse as sp
import tensorflow as tf
from tensorflow.python.framework import op_def_registry

from vaecf.metrics.batched import ChunkMetrics
from vaecf.model import MultVAE
from vaecf.train import calls, data
from vaecf.train import horovod as dist
from vaecf.train.config import PRECISIONS, TrainConfig
from vaecf.train.export import ServingModule

N_ITEMS = 37
# Structure, not kernels: function calls, control flow and graph plumbing.
PLUMBING = {"_Arg", "_Retval", "Placeholder", "NoOp", "Identity", "IdentityN", "Const",
            "PartitionedCall", "StatefulPartitionedCall", "If", "StatelessIf", "While",
            "StatelessWhile", "VarHandleOp", "ReadVariableOp", "AssignVariableOp"}
# Ops whose outputs live in host memory wherever they run (graph inputs are the host's values,
# e.g. a batch's padded size; the batch itself is the only device input and feeds no
# host-memory argument).
HOST_SOURCES = {"Const", "Placeholder", "_Arg"}


def step_graph(precision: str, xla: bool) -> tf.compat.v1.GraphDef:
    """The training loop's compiled call as a GPU runs it (``calls.make_train_call``, as the
    trainer builds it): each step's gather from the resident CSR rows and the one training
    step, its first layer in the GPU's form."""
    config = TrainConfig(split="", output="", checkpoint_dir="", precision=precision,
                         hidden=16, latent=4, anneal_steps=10, xla=xla, l2=0.01)
    model = MultVAE(N_ITEMS, hidden=16, latent=4, policy=config.keras_policy, seed=3,
                    xla=xla, first_layer="segment" if xla else "dense")
    model.build_variables()
    optimizer = dist.make_optimizer(config)
    optimizer.build(model.trainable_variables)
    runtime = dist.Runtime(rank=0, size=1, local_rank=0, hosts=1, hvd=None)
    matrix = sp.random(8, N_ITEMS, density=0.2, format="csr", random_state=0, dtype=np.float32)
    maker = data.BatchMaker(matrix, 4, device="/CPU:0", one_size=xla)
    whole = dist.compiles_whole(config, runtime)
    call = calls.make_train_call(dist.train_step(model, optimizer, config, runtime),
                                 maker.gather, limit=2, jit_compile=whole)
    users = np.arange(8, dtype=np.int64).reshape(2, 4)
    placed, padded = data.call_inputs(maker, users, maker.padded_sizes(users[:, np.newaxis]),
                                      static=whole)
    start, count = tf.constant(0, tf.int64), tf.constant(2, tf.int64)
    return call.get_concrete_function(placed, padded, start, count,
                                      tf.constant(0, tf.int64)).graph.as_graph_def()


GRAPH_TITLES = (*(f"step {p}{' xla' if xla else ''}" for p in PRECISIONS for xla in (False, True)),
                "evaluation chunk", "evaluation chunk blocked top-k",
                "export score", "export recommend", "export recommend_ids")


def traced_graphs() -> dict[str, tf.compat.v1.GraphDef]:
    """Every graph the GPU path runs, by name."""
    graphs = {f"step {p}{' xla' if xla else ''}": step_graph(p, xla)
              for p in PRECISIONS for xla in (False, True)}
    chunk = ChunkMetrics(N_ITEMS, [("ndcg_at_100", "ndcg", 100), ("recall_at_20", "recall", 20)],
                         top_k=10)
    graphs["evaluation chunk"] = chunk._fn.get_concrete_function().graph.as_graph_def()
    blocked = ChunkMetrics(N_ITEMS, [("ndcg_at_100", "ndcg", 100)], top_k=100,
                           blocked_top_k=True)  # the GPU's top-k for k >= 100
    graphs["evaluation chunk blocked top-k"] = (
        blocked._fn.get_concrete_function().graph.as_graph_def())
    model = MultVAE(N_ITEMS, hidden=16, latent=4, dropout=0.0, first_layer="dense")
    model.build_variables()
    module = ServingModule(model, np.array([str(i) for i in range(N_ITEMS)]),
                           np.arange(N_ITEMS, dtype=np.float32))
    graphs["export score"] = module.score.get_concrete_function().graph.as_graph_def()
    graphs["export recommend"] = module.recommend.get_concrete_function().graph.as_graph_def()
    graphs["export recommend_ids"] = (
        module.recommend_ids.get_concrete_function().graph.as_graph_def())
    return graphs


def signature(node: tf.compat.v1.NodeDef) -> str:
    """``Op[attr=dtype,...]``: the op and its dtype attributes (what picks a kernel)."""
    parts = []
    for name, value in sorted(node.attr.items()):
        if value.type:
            parts.append(f"{name}={tf.dtypes.as_dtype(value.type).name}")
        elif value.list.type:
            types = ",".join(tf.dtypes.as_dtype(t).name for t in value.list.type)
            parts.append(f"{name}=[{types}]")
    return f"{node.op}[{';'.join(parts)}]"


def on_cpu(node: tf.compat.v1.NodeDef) -> bool:
    """Placed on the CPU explicitly (``with tf.device("/CPU:0")``): a host op by design, e.g.
    string work, which has no GPU kernels; its outputs are host values."""
    return tf.DeviceSpec.from_string(node.device).device_type == "CPU"


def _arg_names(node: tf.compat.v1.NodeDef, args: list) -> list[str]:
    """The op-def argument name of each input (or output) position of ``node``."""
    names: list[str] = []
    for arg in args:
        if arg.number_attr:
            count = node.attr[arg.number_attr].i
        elif arg.type_list_attr:
            count = len(node.attr[arg.type_list_attr].list.type)
        else:
            count = 1
        names.extend([arg.name] * count)
    return names


class Graph:
    """The nodes of a traced graph and of every function it calls, with their producers."""

    def __init__(self, graph_def: tf.compat.v1.GraphDef) -> None:
        self.scopes = [({n.name: n for n in graph_def.node}, list(graph_def.node), True)]
        for function in graph_def.library.function:
            nodes = {n.name: n for n in function.node_def}
            self.scopes.append((nodes, list(function.node_def), False))

    def nodes(self) -> Iterator[tf.compat.v1.NodeDef]:
        for _, nodes, _ in self.scopes:
            yield from (n for n in nodes if n.op not in PLUMBING and not on_cpu(n))

    def host_inputs_from_device(self, fixture: dict[str, dict]) -> Iterator[str]:
        """``node <- producer`` for each host-memory input computed on the device."""
        for by_name, nodes, top in self.scopes:
            for node in nodes:
                entry = fixture.get(signature(node)) or {}
                host = set(entry.get("host_memory", []))
                if not host or node.op in PLUMBING or on_cpu(node):
                    continue
                op_def = op_def_registry.get(node.op)
                inputs = [i for i in node.input if not i.startswith("^")]
                for arg, source in zip(_arg_names(node, op_def.input_arg), inputs, strict=False):
                    if arg in host and not self._on_host(by_name, source, top, fixture):
                        yield f"{signature(node)} input {arg} <- {source}"

    def _on_host(self, by_name: dict, source: str, top: bool, fixture: dict) -> bool:
        parts = source.split(":")
        producer = by_name.get(parts[0])
        if producer is None or producer.op in HOST_SOURCES or on_cpu(producer):
            return True  # a function argument, a constant or a host op by design
        if producer.op in ("Identity", "IdentityN", "StopGradient", "ReadVariableOp"):
            inputs = [i for i in producer.input if not i.startswith("^")]
            return producer.op == "ReadVariableOp" or all(
                self._on_host(by_name, i, top, fixture) for i in inputs)
        entry = fixture.get(signature(producer))
        if not entry or not entry.get("gpu"):
            return True  # runs on the host (reported as "no GPU kernel" if so)
        if top:  # "node:index" in a graph, "node:output_arg:index" in a function body
            outputs = _arg_names(producer, op_def_registry.get(producer.op).output_arg)
            index = int(parts[1]) if len(parts) > 1 else 0
            name = outputs[index] if index < len(outputs) else ""
        else:
            name = parts[1] if len(parts) > 1 else ""
        return name in entry.get("host_memory", [])


def needed_signatures(graphs: dict[str, tf.compat.v1.GraphDef]) -> dict[str, list[str]]:
    """Each (op, dtypes) signature the graphs run -> the graphs that run it."""
    needed: dict[str, list[str]] = {}
    for title, graph_def in graphs.items():
        for node in Graph(graph_def).nodes():
            users = needed.setdefault(signature(node), [])
            if title not in users:
                users.append(title)
    return needed
