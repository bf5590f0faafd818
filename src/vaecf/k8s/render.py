"""Render the training MPIJob (kubeflow.org/v2beta1) from the manifest template.

The template is ``manifests/mpijob.yaml``, which is also a standalone, applicable job: the
renderer changes only what varies per run (name, image, workers, slots, GPUs, Secret, the
``vaecf train`` command) and keeps security settings, resources and volumes as written. It
edits the parsed YAML structurally, never as text, so the result is always well-formed.
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vaecf.errors import VaecfError
from vaecf.io.readers import read_text
from vaecf.io.storage import is_s3, split_s3
from vaecf.k8s import job
from vaecf.train.config import DEFAULT_MAX_EPOCHS, DEFAULT_PATIENCE
from vaecf.train.scaling import LR_RULES, scaled_learning_rate

PRECISIONS = ("fp32", "mixed_float16", "mixed_bfloat16")
COMPRESSIONS = ("none", "fp16")  # vaecf train --compression: the allreduce's wire format
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")
# Users per step per rank (one rank per GPU) and how the learning rate follows the global
# batch (vaecf.train.scaling), chosen by time to a validation NDCG@100 target under horovodrun
# -np 2 (README, "Multi-GPU"): a global batch of 1,000 over 8 GPUs left 125 users per GPU.
BATCH_PER_RANK, LR_SCALING = 1024, "sqrt"
GPU_RESOURCE = "nvidia.com/gpu"
RUN_ID_LABEL = "vaecf.io/run-id"
TEMPLATE_ENV = "VAECF_MPIJOB_TEMPLATE"
MAX_WORKERS = 1024
# mpi-operator names the pods <job>-launcher and <job>-worker-<i> and refuses a job whose
# names are not DNS labels of <= 63 (its validateMPIJobName), with only a Warning event: a
# job name leaves room for "-worker-1023".
MAX_JOB_NAME = 63 - len(f"-worker-{MAX_WORKERS - 1}")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def dns_label(value: str) -> bool:
    """A DNS-1123 label (a namespace): a-z, 0-9, '-', at most 63 characters, no dots."""
    return bool(_LABEL.match(value)) and len(value) <= 63


def dns1035_label(value: str, longest: int) -> bool:
    """A DNS-1035 label (a name the cluster builds others from): a-z first, then a-z, 0-9,
    '-', no '-' last, at most ``longest`` characters."""
    return bool(_DNS1035.fullmatch(value)) and len(value) <= longest  # no "\n" after "$"


def dns_subdomain(value: str) -> bool:
    """A DNS-1123 subdomain (a Secret's or ServiceAccount's name): at most 253 characters."""
    return bool(_DNS1123.match(value)) and len(value) <= 253
# registry/path[:tag][@sha256:digest], lower-case path as the OCI distribution spec requires.
_IMAGE = re.compile(r"^[a-z0-9.\-:]+(/[a-z0-9._\-]+)+(:[\w][\w.\-]{0,127})?"
                    r"(@sha256:[a-f0-9]{64})?$")


def image_ref(value: str) -> bool:
    """An image reference: registry/name[:tag][@sha256:digest]."""
    return bool(_IMAGE.match(value))


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
    epochs: int | None = None  # None: stop early (``patience``, at most ``max_epochs``)
    patience: int = DEFAULT_PATIENCE
    max_epochs: int = DEFAULT_MAX_EPOCHS
    batch_per_rank: int = BATCH_PER_RANK
    lr_scaling: str = LR_SCALING
    # Measured on one H100 (2026-11-26, README "Results"): mixed_bfloat16 under --xla was the
    # fastest of the three precisions at 4,096 and 16,384 users per step (662k and 638k users/s
    # against fp32's 653k and 544k), --xla ahead of the same precision without it.
    precision: str = "mixed_bfloat16"
    seed: int = 0
    xla: bool = True
    compression: str = "none"
    nccl_debug: str = "WARN"
    secret_name: str = "vaecf-s3"
    tensorboard_uri: str | None = None
    train_flags: tuple[str, ...] = ()  # hyperparameters (``vaecf.tuning.train_flags``)
    # mpi-operator stops the job this long after it started, even if the step died
    active_deadline_seconds: int | None = None

    @property
    def world_size(self) -> int:
        return self.workers * self.slots_per_worker

    @property
    def batch_size(self) -> int:
        """The global batch: ``batch_per_rank`` users on each of the ``world_size`` ranks."""
        return self.batch_per_rank * self.world_size

    @property
    def learning_rate(self) -> float:
        """The learning rate of the global batch under ``lr_scaling``."""
        return scaled_learning_rate(self.batch_size, self.lr_scaling)


def job_name(run_id: str, prefix: str = "vaecf-train") -> str:
    """The MPIJob's name for ``run_id``: at most ``MAX_JOB_NAME`` (51) characters
    (``vaecf.k8s.job.job_name``)."""
    return job.job_name(run_id, prefix, MAX_JOB_NAME)


def run_label(run_id: str) -> str:
    """``run_id`` as a label value: <= 63 of [A-Za-z0-9._-], alphanumeric at both ends."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", run_id)[:63].strip("-._")


def resource_checks(namespace: str, image: str, account_flag: str,
                    account: str) -> list[tuple[bool, str]]:
    """The checks every rendered resource makes of its namespace, its image and the name of its
    credentials (a Secret or a ServiceAccount), each with its one-line refusal."""
    return [
        (dns_label(namespace), f"--namespace {namespace[:80]!r}: expected a "
         "DNS-1123 label (a-z, 0-9, '-', <= 63 chars, no '.')"),
        (dns_subdomain(account), f"{account_flag} {account[:80]!r}: "
         "expected a DNS-1123 name (<= 253 chars)"),
        (image_ref(image), f"--image {image!r}: expected registry/name[:tag][@sha256:digest]"),
    ]


def refuse_failed(checks: list[tuple[bool, str]]) -> None:
    """Raise the message of the first check that failed."""
    for ok, message in checks:
        if not ok:
            raise VaecfError(message)


def validate(params: MPIJobParams) -> None:
    """Refuse bad parameters before anything is created (a bad input must not hold GPUs)."""
    worker = f"{params.name}-worker-{max(params.workers, 1) - 1}"
    checks: list[tuple[bool, str]] = [
        (dns1035_label(worker, 63),
         f"job name {params.name!r}: its pod {worker!r} would not be a DNS-1035 label "
         "(a-z, 0-9, '-', <= 63 chars), which mpi-operator requires"),
        *resource_checks(params.namespace, params.image, "--secret-name", params.secret_name),
        (1 <= params.workers <= MAX_WORKERS,
         f"--workers {params.workers}: expected 1..{MAX_WORKERS}"),
        ((params.active_deadline_seconds or 1) >= 1,
         f"activeDeadlineSeconds {params.active_deadline_seconds}: expected >= 1"),
        (0 <= params.gpus_per_worker <= 16,
         f"--gpus-per-worker {params.gpus_per_worker}: expected 0..16"),
        (params.slots_per_worker >= 1,
         f"--slots-per-worker {params.slots_per_worker}: expected >= 1"),
        (params.gpus_per_worker in (0, params.slots_per_worker),
         f"--slots-per-worker {params.slots_per_worker}: must equal --gpus-per-worker "
         f"{params.gpus_per_worker} (one Horovod rank per GPU)"),
        ((params.epochs is None or params.epochs >= 1), f"--epochs {params.epochs}: expected >= 1"),
        (params.patience >= 1, f"--patience {params.patience}: expected >= 1"),
        (params.max_epochs >= 1, f"--max-epochs {params.max_epochs}: expected >= 1"),
        (params.batch_per_rank >= 1, f"--batch-per-rank {params.batch_per_rank}: expected >= 1"),
        (params.lr_scaling in LR_RULES,
         f"--lr-scaling {params.lr_scaling!r}: expected one of {', '.join(LR_RULES)}"),
        (params.precision in PRECISIONS,
         f"--precision {params.precision!r}: expected one of {', '.join(PRECISIONS)}"),
        (params.compression in COMPRESSIONS,
         f"--compression {params.compression!r}: expected one of {', '.join(COMPRESSIONS)}"),
        (params.nccl_debug in NCCL_DEBUG_LEVELS,
         f"--nccl-debug {params.nccl_debug!r}: expected one of "
         f"{', '.join(NCCL_DEBUG_LEVELS)}"),
    ]
    refuse_failed(checks)
    uris = [("split", params.split_uri), ("model", params.model_uri),
            ("checkpoint", params.checkpoint_uri)]
    if params.tensorboard_uri:
        uris.append(("tensorboard", params.tensorboard_uri))
    for what, uri in uris:
        if not is_s3(uri):
            raise VaecfError(f"{what} {uri!r}: the MPIJob's pods need an s3:// URI")
        split_s3(uri)  # raises on a malformed bucket


def default_template(env: str = TEMPLATE_ENV, name: str = "mpijob.yaml") -> Path:
    """``$env`` (set in the launcher image), else the repository's ``manifests/<name>``; by
    default the MPIJob's."""
    configured = os.environ.get(env)
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[3] / "manifests" / name


def load_template(path: Path, kind: str = "MPIJob") -> dict[str, Any]:
    """The ``kind`` manifest at ``path``, refused in one line if unreadable or of another kind."""
    import yaml

    text = read_text(path, f"{path}: the {kind} template")
    try:
        template: dict[str, Any] = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise VaecfError(f"{path}: cannot read the {kind} template ({err})") from err
    if not isinstance(template, dict) or template.get("kind") != kind:
        raise VaecfError(f"{path}: not an {kind} manifest")
    if not isinstance(template.get("spec"), dict):
        raise VaecfError(f"{path}: the {kind} template has no 'spec' mapping")
    if kind == "MPIJob":
        try:
            for role in ("Launcher", "Worker"):
                container(template["spec"], role)
        except VaecfError as err:
            raise VaecfError(f"{path}: {err}") from None
    return template


def train_command(params: MPIJobParams) -> list[str]:
    """``vaecf train ...`` as every rank runs it (flags of docs/contracts: ``vaecf train``).

    The global batch and the learning rate are written out as numbers, so the job records
    what it trains with. A trial's own ``--learning-rate`` (in ``train_flags``: a searched
    value is the rate itself) replaces the scaled one rather than following it."""
    searched = "--learning-rate" in params.train_flags
    command = [
        "vaecf", "train",
        "--split", params.split_uri,
        "--output", params.model_uri,
        "--checkpoint-dir", params.checkpoint_uri,
        *(["--patience", str(params.patience), "--max-epochs", str(params.max_epochs)]
          if params.epochs is None else ["--epochs", str(params.epochs)]),
        "--batch-size", str(params.batch_size),
        *([] if searched else ["--learning-rate", str(params.learning_rate)]),
        "--precision", params.precision,
        "--seed", str(params.seed),
        "--expect-world-size", str(params.world_size),
        "--expect-hosts", str(params.workers),
        *params.train_flags,
    ]
    if params.tensorboard_uri:
        command += ["--tensorboard-dir", params.tensorboard_uri]
    if params.compression != "none":
        command += ["--compression", params.compression]
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
    if params.active_deadline_seconds is not None:
        spec.setdefault("runPolicy", {})["activeDeadlineSeconds"] = params.active_deadline_seconds
    launcher = container(spec, "Launcher")
    worker = container(spec, "Worker")
    spec["mpiReplicaSpecs"]["Worker"]["replicas"] = params.workers
    launcher["image"] = worker["image"] = params.image
    launcher["args"] = _mpirun_options(launcher.get("args", []), params.world_size)
    launcher["args"] += train_command(params)
    for env in launcher.get("env", []):
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            ref["name"] = params.secret_name
    _set_env(launcher, "NCCL_DEBUG", params.nccl_debug)  # mpirun -x forwards it to the ranks
    _set_gpus(spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"], worker,
              params.gpus_per_worker)
    return job


def container(spec: dict[str, Any], role: str) -> dict[str, Any]:
    """The first container of an MPIJob spec's ``role`` (Launcher, Worker) replica."""
    try:
        found: dict[str, Any] = spec["mpiReplicaSpecs"][role]["template"]["spec"][
            "containers"][0]
    except (KeyError, IndexError, TypeError) as err:
        raise VaecfError(f"MPIJob template: no {role} container") from err
    if not isinstance(found, dict):
        raise VaecfError(f"MPIJob template: the {role} container is not a mapping")
    return found


def _mpirun_options(args: list[str], world_size: int) -> list[str]:
    """The template's mpirun options (everything before ``vaecf``) with ``-np`` set and the
    launcher's ``NCCL_DEBUG`` forwarded to the ranks (``-x NAME``, the value from its env)."""
    options = list(args[:args.index("vaecf")] if "vaecf" in args else args)
    if "-np" in options:
        options[options.index("-np") + 1] = str(world_size)
    else:
        options[:0] = ["-np", str(world_size)]
    for i, option in enumerate(options[:-1]):
        if option == "-x" and options[i + 1].split("=", 1)[0] == "NCCL_DEBUG":
            options[i + 1] = "NCCL_DEBUG"  # a value written here would override the env's
            return options
    return [*options, "-x", "NCCL_DEBUG"]


def _set_env(container: dict[str, Any], name: str, value: str) -> None:
    """Set ``name`` to ``value`` in the container's env, in place if it is there."""
    env = container.setdefault("env", [])
    for entry in env:
        if entry.get("name") == name:
            entry.pop("valueFrom", None)
            entry["value"] = value
            return
    env.append({"name": name, "value": value})


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
