"""The GPU train image's CUDA compiler comes from PyPI and Debian, one pinned release, never from
NVIDIA's own repository (which air-gapped clusters and this project's CI cannot reach).
`make image-check` builds the image; these checks keep the pins honest without building."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "docker" / "train.Dockerfile").read_text()


def build_arg(name: str) -> str:
    match = re.search(rf'^ARG {name}="?([^"\n]*)"?$', DOCKERFILE, re.MULTILINE)
    assert match, f"train.Dockerfile has no ARG {name}"
    return match.group(1)


def test_no_nvidia_download_host() -> None:
    assert "nvidia.com" not in DOCKERFILE
    assert "cuda-keyring" not in DOCKERFILE


def test_nvcc_binaries_and_wheels_are_one_release() -> None:
    wheels = dict(pin.split("==") for pin in build_arg("CUDA_WHEELS").split())
    deb_version = build_arg("NVCC_DEB").split("=", 1)[1]
    # Debian's version is <nvcc release>~<toolkit release>-<revision>.
    assert deb_version.split("~")[0] == wheels["nvidia-cuda-nvcc-cu12"] == "12.4.131"
    minor = ".".join(wheels["nvidia-cuda-nvcc-cu12"].split(".")[:2])
    for name in ("nvidia-cuda-runtime-cu12", "nvidia-cuda-cccl-cu12"):
        assert wheels[name].startswith(minor + "."), (name, wheels[name])


def test_kernels_are_built_for_a100_and_h100() -> None:
    assert {"80", "90"} <= set(build_arg("CUDA_CC_LIST").split(","))
    assert 'HOROVOD_BUILD_CUDA_CC_LIST="$CUDA_CC_LIST"' in DOCKERFILE


def test_lock_is_a_constraints_file() -> None:
    """The train image installs under `pip install -c requirements.lock`, and pip refuses a
    constraint with extras, a marker or a URL ("Constraints cannot have extras"): each line is
    one exact `name==version` pin, each name once."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    assert "-c /tmp/requirements.lock" in DOCKERFILE
    names = []
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        pin = Requirement(line)
        assert not pin.extras and pin.marker is None and pin.url is None, line
        (spec,) = pin.specifier
        assert spec.operator == "==" and "*" not in spec.version, line
        names.append(canonicalize_name(pin.name))
    assert len(names) == len(set(names)) > 100
