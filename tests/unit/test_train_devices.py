"""Start-up order on a GPU host: every tf.config call before TensorFlow's first op.

CI has no GPU, so ``list_physical_devices`` is made to report two (a small fake) and the calls
that would touch them record whether TensorFlow's eager context exists yet. Each check runs
in a fresh interpreter: the test process's context was created long ago.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from vaecf.train import devices

SRC = str(Path(__file__).resolve().parents[2] / "src")

FAKE_GPUS = textwrap.dedent("""
    import json, os
    import tensorflow as tf
    from tensorflow.python.eager import context

    calls = []
    gpus = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(2)]
    real_list = tf.config.list_physical_devices

    def record(name):
        def call(*args, **kwargs):
            calls.append([name, context.context()._context_handle is None, str(args)])
            return {"device_name": "Fake H100", "compute_capability": (9, 0)}
        return call

    tf.config.list_physical_devices = lambda kind=None: gpus if kind == "GPU" else real_list(kind)
    tf.config.experimental.set_memory_growth = record("memory_growth")
    tf.config.set_visible_devices = record("visible_devices")
    tf.config.experimental.get_device_details = record("details")
    tf.config.threading.set_intra_op_parallelism_threads = record("intra_threads")
    tf.config.threading.set_inter_op_parallelism_threads = record("inter_threads")
""")


def run_fake(body: str) -> list[list]:
    script = FAKE_GPUS + textwrap.dedent(body) + "\nprint(json.dumps(calls))\n"
    env = {**os.environ, "PYTHONPATH": SRC, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_device_configuration_runs_before_any_tensorflow_op() -> None:
    calls = run_fake("""
        from vaecf.train import horovod as dist
        from vaecf.train.config import TrainConfig
        runtime = dist.start(TrainConfig(split="", output="", checkpoint_dir=""))
        assert runtime.hosts == 1 and runtime.size == 1
        assert context.context()._context_handle is not None  # start did run TF ops after
    """)
    names = [name for name, _, _ in calls]
    assert "memory_growth" in names and "visible_devices" in names
    late = [name for name, before_context, _ in calls
            if name in ("memory_growth", "visible_devices") and not before_context]
    assert late == [], f"{late} ran after TensorFlow's context was created"


def test_ranks_on_a_gpu_host_share_its_cores_and_pin_their_own_gpu() -> None:
    calls = run_fake("""
        from vaecf.train import devices
        print(devices.configure(local_rank=3, local_size=4))
    """)
    threads = max(1, (os.cpu_count() or 1) // 4)
    by_name = {name: args for name, _, args in calls}
    assert by_name["intra_threads"] == by_name["inter_threads"] == f"({threads},)"
    assert "GPU:1" in by_name["visible_devices"]  # local rank 3 of 2 GPUs


def test_a_gpu_without_machine_code_says_its_kernels_jit_from_ptx() -> None:
    built = ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"]
    h100 = devices.describe_gpu("NVIDIA H100", (9, 0), built)
    assert "no sm_90 machine code" in h100 and "PTX" in h100 and "CUDA_CACHE_MAXSIZE" in h100
    a100 = devices.describe_gpu("NVIDIA A100", (8, 0), built)
    assert "has machine code" in a100 and "PTX" not in a100


def test_nccl_settings_are_logged_on_a_gpu_host(capsys) -> None:
    devices.log_setup(["GPU x"], {"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5", "HOME": "/h"})
    out = capsys.readouterr()
    text = out.out + out.err
    assert "NCCL settings: NCCL_DEBUG=INFO NCCL_IB_HCA=mlx5" in text and "HOME" not in text
