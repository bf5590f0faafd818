"""Device set-up of a training process: every ``tf.config`` call, before TensorFlow runs an op.

TensorFlow fixes its devices and thread pools when its eager context is created, which
happens at the first op (a ``tf.constant``, a Horovod ``allgather_object``). After that,
``set_memory_growth`` and ``set_visible_devices`` raise ``RuntimeError: Physical devices
cannot be modified after being initialized`` and the thread settings are ignored, so
``configure`` is the first thing ``horovod.start`` does after ``hvd.init()``.

It also says once, on rank 0, what a GPU run needs to know and TensorFlow's log level hides:
whether this GPU runs TensorFlow's kernels from PTX (JIT-compiled by the driver on first use,
e.g. an H100 under TensorFlow 2.17, built for sm_60..sm_89 plus compute_90 PTX) and the
``NCCL_*`` settings the collectives use.
"""

from __future__ import annotations

import os

import tensorflow as tf

from vaecf import log


def configure(local_rank: int, local_size: int) -> list[str]:
    """Pin this rank's GPU and size its thread pools; returns the GPUs' descriptions.

    Args:
      local_rank: this process's index among the ranks on its host (picks its GPU).
      local_size: ranks on this host, which share its cores: each rank's pools get a share,
        on GPU hosts too (8 ranks each sizing their pools for every core oversubscribe it).
    """
    gpus = tf.config.list_physical_devices("GPU")  # lists devices without creating a context
    if local_size > 1:
        threads = max(1, (os.cpu_count() or 1) // local_size)
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    if not gpus:
        return []
    gpu = gpus[local_rank % len(gpus)]
    tf.config.experimental.set_memory_growth(gpu, True)  # share the GPU with other ranks
    tf.config.set_visible_devices(gpu, "GPU")  # Horovod: pin the GPU by local rank
    return [ptx_note(gpu)]


def ptx_note(gpu: tf.config.PhysicalDevice) -> str:
    """One line on ``gpu``: its name, compute capability and whether kernels JIT from PTX."""
    details = tf.config.experimental.get_device_details(gpu)
    built = list(tf.sysconfig.get_build_info().get("cuda_compute_capabilities", []))
    return describe_gpu(str(details.get("device_name", gpu.name)),
                        tuple(details.get("compute_capability", (0, 0))), built)


def describe_gpu(name: str, capability: tuple[int, int], built: list[str]) -> str:
    """The start-up line for a GPU of ``capability`` under a TensorFlow built for ``built``.

    Args:
      built: TensorFlow's ``cuda_compute_capabilities`` (``sm_80``: machine code for 8.0,
        ``compute_90``: PTX for 9.0 and newer).
    """
    major, minor = capability
    arch = f"sm_{major}{minor}"
    line = f"GPU {name}, compute capability {major}.{minor}"
    if not built:
        return line
    if arch in built:
        return f"{line}: TensorFlow has machine code for it"
    return (f"{line}: TensorFlow ({', '.join(built)}) has no {arch} machine code, so the "
            "driver JIT-compiles its kernels from PTX on first use (slow first steps); keep "
            "the cache between runs: CUDA_CACHE_MAXSIZE=4294967296 and a persistent "
            "~/.nv/ComputeCache")


def log_setup(gpus: list[str], environ: dict[str, str] | None = None) -> None:
    """Log the GPU lines and the NCCL settings (rank 0 alone logs; see ``log.set_quiet``)."""
    for line in gpus:
        log.info(line)
    environ = dict(os.environ) if environ is None else environ
    nccl = sorted(f"{key}={value}" for key, value in environ.items() if key.startswith("NCCL_"))
    if gpus:
        log.info("NCCL settings: " + (" ".join(nccl) if nccl else "none (NCCL's defaults; "
                                      "NCCL_DEBUG=INFO shows the transport it picks)"))
