"""The hardware and software a measurement was taken on, and the device's matmul rate.

A speed number means nothing without the machine it came from: every benchmark records the
CPU model and cores, GPUs, library versions and the load average (this machine may be shared),
and the measured dense matmul rate that the compute bound is built on.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

# Dense matmul dtype per training precision (the policy's compute dtype).
MATMUL_DTYPES = {"fp32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The ``model name`` of the first CPU in ``/proc/cpuinfo`` (None if not Linux)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def gpus() -> list[str]:
    """Names of the GPUs TensorFlow sees (empty on a CPU build or CPU machine)."""
    import tensorflow as tf

    names = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        names.append(str(details.get("device_name", device.name)))
    return names


def grow_gpu_memory() -> None:
    """Let TensorFlow take GPU memory as it needs it, in this process, on every GPU.

    By default TensorFlow reserves nearly all of a GPU's memory at its first op; a benchmark
    process that does so starves the ``vaecf train`` processes it starts (every run failed
    with ResourceExhaustedError on an H100). Must run before this process's first TF op.
    """
    import tensorflow as tf

    for device in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(device, True)


def nvidia_gpus() -> list[dict[str, str]]:
    """Model and driver version of each GPU, from ``nvidia-smi`` (empty when there is none)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [{"name": name.strip(), "driver_version": driver.strip()}
            for name, _, driver in (line.rpartition(",") for line in out.splitlines())
            if name.strip()]


def describe_device(machine: dict[str, Any]) -> str:
    """One line naming what a run computed on: the GPU (driver, CUDA, cuDNN) or the CPU."""
    gpus_seen = machine.get("gpus") or []
    if machine.get("gpu_count") and gpus_seen:
        names = sorted({f"{g['name']} (driver {g['driver_version']})" for g in gpus_seen})
        return (f"{machine['gpu_count']} x GPU {', '.join(names)}, CUDA {machine.get('cuda')}, "
                f"cuDNN {machine.get('cudnn')}")
    return f"CPU {machine.get('cpu_model')} ({machine.get('cpu_cores_usable')} usable cores)"


def fingerprint() -> dict[str, Any]:
    """CPU, GPUs (model, driver), library versions (TF, Keras, Horovod, CUDA/cuDNN as TF was
    built), load, and ``device``: one line naming what the runs compute on."""
    import tensorflow as tf

    build = tf.sysconfig.get_build_info()
    names = gpus()
    machine = {
        "cpu_model": cpu_model(), "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": len(os.sched_getaffinity(0)),
        "gpu_count": len(names), "gpu_names": names, "gpus": nvidia_gpus() if names else [],
        "platform": platform.platform(),
        "python": platform.python_version(), "tensorflow": tf.__version__,
        "keras": _version("keras"), "horovod": _version("horovod"),
        "cuda": build.get("cuda_version"), "cudnn": build.get("cudnn_version"),
        "load_average": fingerprint_load(),
    }
    return machine | {"device": describe_device(machine)}


def fingerprint_load() -> list[float]:
    """1, 5 and 15 minute load averages: a busy shared host explains a slow run."""
    return [round(x, 2) for x in os.getloadavg()]


def probe_shape() -> tuple[int, int]:
    """(matrix size, products per sync) of the matmul-rate probe on this machine's device.

    A GPU finishes a 2048-square product in 22-45 us on an H100, less than one call and
    sync (50-100 us): one product per sync measured the launch, not the math, and
    overstated ``bound_fraction`` 2-4x. So a GPU chains 16 products of 8192-square
    matrices (1.1 TFLOP each, about 3 ms at TF32) per sync. A CPU takes 0.1-0.2 s per
    2048-square product, which a sync cannot distort; on this project's shared 2-core host
    chains of 4 or 8 per sync measured no higher rate than one (fp32 72-127 against 98-128
    GFLOP/s, bf16 140-216 against 182-184, best of interleaved trials under load), and
    short calls catch more of a shared host's idle moments, so a CPU keeps one.
    """
    return (8192, 16) if gpus() else (2048, 1)


def matmul_chain(products: int) -> Any:
    """A compiled ``(a, b) -> float32 scalar`` computing a @ b @ b ... (``products`` dependent
    products) and one element of the result: one call, one sync, all products finished."""
    import tensorflow as tf

    @tf.function
    def chain(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        for _ in range(products):
            x = tf.matmul(x, y)
        return tf.reduce_sum(tf.cast(x[0, :1], tf.float32))

    return chain


def matmul_rate(precision: str, trials: int = 20, trial_seconds: float = 0.1,
                shape: tuple[int, int] | None = None) -> float:
    """Peak FLOP/s of square dense matmuls in the precision's compute dtype.

    One call computes a chain of ``products`` products (``probe_shape``, or ``shape``:
    (size, products)) and pulls one number back. After one untimed warm-up call, each trial
    repeats the call for ``trial_seconds``; the best trial is kept, because a bound is the
    rate the device can reach (a shared host slows some trials down, never speeds one up;
    many short trials catch its idle moments). A ``size``-square product costs
    ``2 * size**3`` FLOPs. On a GPU machine this runs on the first GPU, else on the CPU.
    """
    import tensorflow as tf

    size, products = shape or probe_shape()
    dtype = getattr(tf, MATMUL_DTYPES[precision])
    a = tf.cast(tf.random.stateless_normal((size, size), seed=(1, 2)), dtype)
    # Entries of variance 1/size keep the chain's magnitudes near 1 (no float16 overflow).
    b = tf.cast(tf.random.stateless_normal((size, size), seed=(3, 4)) / size ** 0.5, dtype)
    chain = matmul_chain(products)
    float(chain(a, b))
    best = 0.0
    for _ in range(trials):
        start, count = time.perf_counter(), 0
        while count == 0 or time.perf_counter() - start < trial_seconds:
            float(chain(a, b))  # pulls the result back, so every product has finished
            count += 1
        best = max(best, 2.0 * size ** 3 * products * count / (time.perf_counter() - start))
    return best
