"""Every op the GPU path runs has a GPU kernel for its dtypes and makes the host wait for nothing.

CI has tensorflow-cpu only: ``gpu_kernels.json`` holds what TensorFlow's CUDA build says about
each (op, dtypes) (recorded by ``record_gpu_kernels.py``). An op without a GPU kernel runs on
the host, so its inputs and outputs cross the bus every step (an int64 ``Pad`` once did); a
GPU kernel's host-memory input computed on the device (e.g. ``tf.range`` of a device value)
makes the host wait for the device mid-step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import tensorflow as tf

sys.path.insert(0, str(Path(__file__).parent))
from graphs import GRAPH_TITLES, Graph, needed_signatures, traced_graphs

FIXTURE = json.loads((Path(__file__).with_name("gpu_kernels.json")).read_text())


@pytest.fixture(scope="module")
def graphs() -> dict[str, tf.compat.v1.GraphDef]:
    return traced_graphs()


def test_the_fixture_is_from_the_pinned_tensorflow() -> None:
    assert FIXTURE["tensorflow"] == tf.__version__


def test_every_op_of_the_gpu_path_has_a_gpu_kernel_for_its_dtypes(graphs) -> None:
    needed = needed_signatures(graphs)
    assert any(sig.startswith("MatMul[") for sig in needed)  # it sees the step's ops
    assert sorted(graphs) == sorted(GRAPH_TITLES)
    missing = {sig: users for sig, users in needed.items() if sig not in FIXTURE["kernels"]}
    assert not missing, ("not in gpu_kernels.json (run tests/gpu/record_gpu_kernels.py with "
                         f"the CUDA build): {missing}")
    host_only = {sig: users for sig, users in needed.items()
                 if not FIXTURE["kernels"][sig]["gpu"]}
    assert not host_only, f"no GPU kernel, so these run on the host: {host_only}"


@pytest.mark.parametrize("title", GRAPH_TITLES)
def test_no_host_memory_input_is_computed_on_the_device(graphs, title: str) -> None:
    waits = sorted(set(Graph(graphs[title]).host_inputs_from_device(FIXTURE["kernels"])))
    assert not waits, f"{title}: the host waits for the device at {waits}"


@pytest.mark.parametrize("device", [None, "/CPU:0"])
def test_only_an_op_placed_on_the_cpu_is_a_host_op_by_design(device: str | None) -> None:
    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def to_size(x: tf.Tensor) -> tf.Tensor:
        with tf.device(device):
            last = x[-1]  # StridedSlice[T=int64]: a GPU kernel whose output is on the device
        return tf.range(tf.constant(0, tf.int64), last, tf.constant(1, tf.int64))

    graph = Graph(to_size.get_concrete_function().graph.as_graph_def())
    waits = list(graph.host_inputs_from_device(FIXTURE["kernels"]))
    sliced = any(node.op == "StridedSlice" for node in graph.nodes())
    if device is None:  # Range's limit is host memory: the host waits for the slice
        assert sliced and waits == ["Range[Tidx=int64] input limit <- strided_slice"]
    else:  # the slice runs on the host: no GPU kernel needed, no wait
        assert not sliced and not waits
