"""Record what TensorFlow's CUDA build offers each op of the GPU path into gpu_kernels.json.

Run by hand (no GPU needed) with the CUDA build of the pinned TensorFlow ahead of
tensorflow-cpu on the path, whenever ``test_gpu_kernels.py`` reports an op "not recorded":

    pip download tensorflow==2.17.1 --no-deps --only-binary=:all: -d /tmp/tfgpu
    unzip -q /tmp/tfgpu/tensorflow-2.17.1-*.whl -d /tmp/tfgpu/site
    PYTHONPATH=/tmp/tfgpu/site:src python tests/gpu/record_gpu_kernels.py

For each (op, dtype attributes) the traced graphs run, it writes whether a GPU (or DEFAULT)
kernel matches and which of its arguments that kernel keeps in host memory.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import tensorflow as tf
from tensorflow.python.framework import kernels

sys.path.insert(0, str(Path(__file__).parent))
from graphs import needed_signatures, traced_graphs

FIXTURE = Path(__file__).with_name("gpu_kernels.json")


def _matches(kernel: object, attrs: dict[str, list[str]]) -> bool:
    for constraint in kernel.constraint:  # type: ignore[attr-defined]
        wanted = attrs.get(constraint.name)
        allowed = {tf.dtypes.as_dtype(t).name for t in constraint.allowed_values.list.type}
        if wanted is not None and not set(wanted) <= allowed:
            return False
    return True


def _attrs(sig: str) -> tuple[str, dict[str, list[str]]]:
    op, _, rest = sig.partition("[")
    attrs = {}
    for part in filter(None, rest.rstrip("]").split(";")):
        name, _, value = part.partition("=")
        attrs[name] = value.strip("[]").split(",")
    return op, attrs


def record(sig: str) -> dict[str, object]:
    op, attrs = _attrs(sig)
    found = [k for k in kernels.get_registered_kernels_for_op(op).kernel
             if k.device_type in ("GPU", "DEFAULT") and _matches(k, attrs)]
    if not found:
        return {"gpu": False}
    best = max(found, key=lambda k: k.priority)
    return {"gpu": True, "host_memory": sorted(best.host_memory_arg)}


def main() -> None:
    if not tf.test.is_built_with_cuda():
        sys.exit("record_gpu_kernels.py: this TensorFlow is not the CUDA build (put it first "
                 "on PYTHONPATH, see the module docstring)")
    needed = needed_signatures(traced_graphs())
    fixture = {"tensorflow": tf.__version__,
               "kernels": {sig: record(sig) for sig in sorted(needed)}}
    FIXTURE.write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
    print(f"{FIXTURE}: {len(needed)} (op, dtypes) entries from TensorFlow {tf.__version__}")


if __name__ == "__main__":
    main()
