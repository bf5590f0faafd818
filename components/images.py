"""The pipeline's container images, in one place.

Five images, one per dependency set (``docker/``): ``data`` (download, preprocess, split),
``train`` (TensorFlow + Horovod + OpenMPI: the MPIJob and evaluate), ``launcher`` (the
train step, ``vaecf launch-mpijob``, the report step and the optional serve step), ``serve``
(the KServe predictor, ``vaecf serve``) and ``spark`` (preprocess and split with ``--engine
spark``: a Spark application's driver and executors). ``make pipeline`` sets the registry and
tag, and pins images by digest when ``make push`` has recorded them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

NAMES = ("data", "train", "launcher", "serve", "spark")
DEFAULT_REGISTRY = "ghcr.io/vaecf"
DEFAULT_TAG = "0.1.0"
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class Images:
    """Image references: ``<registry>/vaecf-<name>:<tag>``, or ``...@sha256:...`` if pinned."""

    registry: str = DEFAULT_REGISTRY
    tag: str = DEFAULT_TAG
    digests: dict[str, str] = field(default_factory=dict)

    def ref(self, name: str) -> str:
        if name not in NAMES:
            raise ValueError(f"unknown image {name!r} (one of {', '.join(NAMES)})")
        repository = f"{self.registry.rstrip('/')}/vaecf-{name}"
        digest = self.digests.get(name)
        return f"{repository}@{digest}" if digest else f"{repository}:{self.tag}"

    @property
    def data(self) -> str:
        return self.ref("data")

    @property
    def train(self) -> str:
        return self.ref("train")

    @property
    def launcher(self) -> str:
        return self.ref("launcher")

    @property
    def serve(self) -> str:
        return self.ref("serve")


def load_digests(path: Path) -> dict[str, str]:
    """``{"data": "sha256:...", ...}`` as written by ``make push`` (``build/digests.json``)."""
    digests = json.loads(path.read_text())
    for name, digest in digests.items():
        if name not in NAMES or not _DIGEST.match(digest):
            raise ValueError(f"{path}: {name}: expected one of {NAMES} -> sha256:<64 hex>")
    return dict(digests)


DEFAULT = Images()
