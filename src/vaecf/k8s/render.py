"""Render the training MPIJob (kubeflow.org/v2beta1) from the manifest template.

The template is ``manifests/mpijob.yaml``, which is also a standalone, applicable job: the
renderer changes only what varies per run (name, image, workers, slots, GPUs, Secret, the
``vaecf train`` command) and keeps security settings, resources and volumes as written. It
edits the parsed YAML structurally, never as text, so the result is always well-formed.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vaecf.errors import VaecfError
from vaecf.io.storage import is_s3, split_s3

PRECISIONS = ("fp32", "mixed_float16", "mixed_bfloat16")
GPU_RESOURCE = "nvidia.com/gpu"
RUN_ID_LABEL = "vaecf.io/run-id"
TEMPLATE_ENV = "VAECF_MPIJOB_TEMPLATE"
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# registry/path[:tag][@sha256:digest], lower-case path as the OCI distribution spec requires.
_IMAGE = re.compile(r"^[a-z0-9.\-:]+(/[a-z0-9._\-]+)+(:[\w][\w.\-]{0,127})?"
                    r"(@sha256:[a-f0-9]{64})?$")


@dataclass(frozen=True)
class MPIJobParams:
    """What varies between training runs; everything else comes from the template."""

    name: str
    namespace: str
    run_id: str
    image: str
    split_uri: str
    model_uri: str
    checkpoint_uri: str
    workers: int = 2
    gpus_per_worker: int = 1
    slots_per_worker: int = 1
    epochs: int = 100
    batch_size: int = 1000
    precision: str = "fp32"  # TF32 on GPUs: faster than mixed on the H100 baseline
    seed: int = 0
    xla: bool = False
    secret_name: str = "vaecf-s3"

    @property
    def world_size(self) -> int:
        return self.workers * self.slots_per_worker


def job_name(run_id: str, prefix: str = "vaecf-train") -> str:
    """A DNS-1035 label (<= 63 chars, starts with a letter) derived from ``run_id``.

    The same run id always gives the same name, which is what lets a retried step attach to
    the job its first attempt created. Over-long ids keep a hash suffix to stay unique.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-")
    if not slug:
        raise VaecfError(f"--run-id {run_id!r}: needs at least one letter or digit")
    name = f"{prefix}-{slug}"
    if len(name) > 63:
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
        name = f"{name[:54].rstrip('-')}-{digest}"
    return name


def run_label(run_id: str) -> str:
    """``run_id`` as a label value: <= 63 of [A-Za-z0-9._-], alphanumeric at both ends."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", run_id)[:63].strip("-._")


def validate(params: MPIJobParams) -> None:
    """Refuse bad parameters before anything is created (a bad input must not hold GPUs)."""
    checks: list[tuple[bool, str]] = [
        (bool(_DNS1035.match(params.name)) and len(params.name) <= 63,
         f"job name {params.name!r}: expected a DNS-1035 label (a-z, 0-9, '-', <= 63 chars)"),
        (bool(_DNS1123.match(params.namespace)) and len(params.namespace) <= 63,
         f"--namespace {params.namespace!r}: expected a DNS-1123 label"),
        (bool(_DNS1123.match(params.secret_name)),
         f"--secret-name {params.secret_name!r}: expected a DNS-1123 name"),
        (bool(_IMAGE.match(params.image)),
         f"--image {params.image!r}: expected registry/name[:tag][@sha256:digest]"),
        (1 <= params.workers <= 1024, f"--workers {params.workers}: expected 1..1024"),
        (0 <= params.gpus_per_worker <= 16,
         f"--gpus-per-worker {params.gpus_per_worker}: expected 0..16"),
        (params.slots_per_worker >= 1,
         f"--slots-per-worker {params.slots_per_worker}: expected >= 1"),
        (params.gpus_per_worker in (0, params.slots_per_worker),
         f"--slots-per-worker {params.slots_per_worker}: must equal --gpus-per-worker "
         f"{params.gpus_per_worker} (one Horovod rank per GPU)"),
        (params.epochs >= 1, f"--epochs {params.epochs}: expected >= 1"),
        (params.batch_size >= params.world_size
         and params.batch_size % max(1, params.world_size) == 0,
         f"--batch-size {params.batch_size}: the global batch must be a multiple of the "
         f"world size {params.world_size} (workers x slots per worker)"),
        (params.precision in PRECISIONS,
         f"--precision {params.precision!r}: expected one of {', '.join(PRECISIONS)}"),
    ]
    for ok, message in checks:
        if not ok:
            raise VaecfError(message)
    for what, uri in (("split", params.split_uri), ("model", params.model_uri),
                      ("checkpoint", params.checkpoint_uri)):
        if not is_s3(uri):
            raise VaecfError(f"{what} {uri!r}: the MPIJob's pods need an s3:// URI")
        split_s3(uri)  # raises on a malformed bucket


def default_template() -> Path:
    """``$VAECF_MPIJOB_TEMPLATE`` (set in the launcher image), else the repository's file."""
    configured = os.environ.get(TEMPLATE_ENV)
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[3] / "manifests" / "mpijob.yaml"


def load_template(path: Path) -> dict[str, Any]:
    import yaml

    try:
        template: dict[str, Any] = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise VaecfError(f"{path}: cannot read the MPIJob template ({err})") from err
    if not isinstance(template, dict) or template.get("kind") != "MPIJob":
        raise VaecfError(f"{path}: not an MPIJob manifest")
    return template


def train_command(params: MPIJobParams) -> list[str]:
    """``vaecf train ...`` as every rank runs it (flags of docs/contracts: ``vaecf train``)."""
    command = [
        "vaecf", "train",
        "--split", params.split_uri,
        "--output", params.model_uri,
        "--checkpoint-dir", params.checkpoint_uri,
        "--epochs", str(params.epochs),
        "--batch-size", str(params.batch_size),
        "--precision", params.precision,
        "--seed", str(params.seed),
        "--expect-world-size", str(params.world_size),
        "--expect-hosts", str(params.workers),
    ]
    return [*command, "--xla"] if params.xla else command


def render(template: dict[str, Any], params: MPIJobParams) -> dict[str, Any]:
    """The MPIJob for ``params``: a deep copy of ``template`` with the per-run fields set."""
    validate(params)
    job = copy.deepcopy(template)
    metadata = job.setdefault("metadata", {})
    metadata["name"] = params.name
    metadata["namespace"] = params.namespace
    metadata.setdefault("labels", {})[RUN_ID_LABEL] = run_label(params.run_id)
    spec = job["spec"]
    spec["slotsPerWorker"] = params.slots_per_worker
    launcher = _container(spec, "Launcher")
    worker = _container(spec, "Worker")
    spec["mpiReplicaSpecs"]["Worker"]["replicas"] = params.workers
    launcher["image"] = worker["image"] = params.image
    launcher["args"] = _mpirun_options(launcher.get("args", []), params.world_size)
    launcher["args"] += train_command(params)
    for env in launcher.get("env", []):
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            ref["name"] = params.secret_name
    _set_gpus(spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"], worker,
              params.gpus_per_worker)
    return job


def _container(spec: dict[str, Any], role: str) -> dict[str, Any]:
    try:
        container: dict[str, Any] = spec["mpiReplicaSpecs"][role]["template"]["spec"][
            "containers"][0]
    except (KeyError, IndexError, TypeError) as err:
        raise VaecfError(f"MPIJob template: no {role} container") from err
    return container


def _mpirun_options(args: list[str], world_size: int) -> list[str]:
    """The template's mpirun options (everything before ``vaecf``) with ``-np`` set."""
    options = list(args[:args.index("vaecf")] if "vaecf" in args else args)
    if "-np" in options:
        options[options.index("-np") + 1] = str(world_size)
    else:
        options[:0] = ["-np", str(world_size)]
    return options


def _set_gpus(pod: dict[str, Any], worker: dict[str, Any], gpus: int) -> None:
    """GPUs per worker; with none, drop the GPU resource and the GPU-taint toleration."""
    resources = worker.setdefault("resources", {})
    for kind in ("requests", "limits"):
        values = resources.setdefault(kind, {})
        if gpus:
            values[GPU_RESOURCE] = str(gpus)
        else:
            values.pop(GPU_RESOURCE, None)
    if not gpus:
        kept = [t for t in pod.get("tolerations", []) if t.get("key") != GPU_RESOURCE]
        if kept:
            pod["tolerations"] = kept
        else:
            pod.pop("tolerations", None)
