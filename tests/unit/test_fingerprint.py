"""What a benchmark records about its device: nvidia-smi's GPUs, or the CPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vaecf.report import fingerprint

# Recorded on the H100 host of DESIGN.md section 8 (two GPUs, as a multi-GPU host prints them).
NVIDIA_SMI_OUTPUT = "NVIDIA H100 80GB HBM3, 550.54.15\nNVIDIA H100 80GB HBM3, 550.54.15\n"


def fake_nvidia_smi(directory: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    script = directory / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ['PATH']}")


def test_gpus_and_driver_come_from_nvidia_smi(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(tmp_path, monkeypatch,
                    '[ "$1 $2" = "--query-gpu=name,driver_version --format=csv,noheader" ] '
                    f"|| exit 9\nprintf '{NVIDIA_SMI_OUTPUT}'")
    gpus = fingerprint.nvidia_gpus()
    assert gpus == [{"name": "NVIDIA H100 80GB HBM3", "driver_version": "550.54.15"}] * 2
    machine = {"gpu_count": 2, "gpus": gpus, "cuda": "12.3", "cudnn": "8",
               "cpu_model": "Xeon", "cpu_cores_usable": 16}
    assert fingerprint.describe_device(machine) == (
        "2 x GPU NVIDIA H100 80GB HBM3 (driver 550.54.15), CUDA 12.3, cuDNN 8")


def test_a_failing_or_missing_nvidia_smi_means_no_gpu(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(tmp_path, monkeypatch, "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    assert fingerprint.nvidia_gpus() == []
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert fingerprint.nvidia_gpus() == []


def test_a_cpu_host_records_its_cpu() -> None:
    machine = fingerprint.fingerprint()
    if machine["gpu_count"]:
        pytest.skip("this host has a GPU: the CPU description does not apply")
    assert machine["gpus"] == []
    assert machine["device"] == (f"CPU {fingerprint.cpu_model()} "
                                 f"({len(os.sched_getaffinity(0))} usable cores)")


def test_the_probe_chains_large_products_per_sync_on_a_gpu(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    # One 2048-square product per sync is launch-bound on a GPU (22-45 us of math against
    # 50-100 us per call): a GPU chains 16 products of 8192-square matrices per sync.
    monkeypatch.setattr(fingerprint, "gpus", lambda: ["NVIDIA H100 80GB HBM3"])
    assert fingerprint.probe_shape() == (8192, 16)
    monkeypatch.setattr(fingerprint, "gpus", lambda: [])
    assert fingerprint.probe_shape() == (2048, 1)


def test_a_chain_is_one_call_of_dependent_products() -> None:
    import numpy as np
    import tensorflow as tf

    a = tf.constant(np.arange(4.0).reshape(2, 2), tf.float32)
    b = tf.constant([[0.0, 1.0], [1.0, 1.0]], tf.float32)
    graph = fingerprint.matmul_chain(3).get_concrete_function(a, b).graph
    assert [op.type for op in graph.get_operations()].count("MatMul") == 3
    # a @ b @ b @ b, element [0, 0]: a[0] = (0, 1) -> (1, 1) -> (1, 2) -> (2, 3).
    assert float(fingerprint.matmul_chain(3)(a, b)) == 2.0
    assert fingerprint.matmul_rate("fp32", trials=2, trial_seconds=0.01, shape=(64, 4)) > 0
