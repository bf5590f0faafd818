"""The Spark steps' SparkApplication (sparkoperator.k8s.io/v1beta2, Kubeflow Spark Operator
2.5): rendered from ``manifests/spark/sparkapplication.yaml`` and run as a job
``vaecf.k8s.job`` runs.

The template is also a standalone, applicable application: the renderer changes only what
varies per run (name, image, the vaecf stage's arguments, driver and executor sizes, executor
count, the Secret's name, the scratch folder, the driver's deadline) and keeps security
settings, ``sparkConf`` and volumes as written, editing the parsed YAML structurally.

States (the operator's ``ApplicationStateType``): ``""`` (new), SUBMITTED, RUNNING,
SUCCEEDING, COMPLETED, FAILING, FAILED, SUBMISSION_FAILED, PENDING_RERUN, INVALIDATING,
SUSPENDING, SUSPENDED, RESUMING, UNKNOWN. COMPLETED and FAILED are the operator's terminal
states; under ``restartPolicy: Never`` SUBMISSION_FAILED is one too (the operator only moves
it to FAILED), so the step fails on it at once.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vaecf.errors import VaecfError
from vaecf.k8s import job, pod_fields, render

GROUP, VERSION, PLURAL = "sparkoperator.k8s.io", "v1beta2", "sparkapplications"
APP_NAME_LABEL = "sparkoperator.k8s.io/app-name"  # on the driver and executor pods
ROLES = {"driver": "spark-kubernetes-driver", "executor": "spark-kubernetes-executor"}
TEMPLATE_ENV = "VAECF_SPARKAPP_TEMPLATE"
SCRATCH_VOLUME = "scratch"
# The operator refuses a name that is not a DNS-1035 label; the driver pod is <name>-driver.
MAX_NAME = 63 - len("-driver")
MAX_EXECUTORS = 1000
_MEMORY = re.compile(r"^[1-9][0-9]*[kmgt]?$")  # a JVM size as Spark takes it: 512m, 4g
SUCCEEDED = ("COMPLETED",)
FAILED = ("FAILED", "SUBMISSION_FAILED")


def application_state(app: dict[str, Any]) -> job.Outcome | None:
    """``(state, succeeded, message)`` once the application has finished, else ``None``."""
    state_of = (app.get("status") or {}).get("applicationState") or {}
    state = str(state_of.get("state") or "")
    error = " ".join(str(state_of.get("errorMessage") or "").split())[:400]
    if state in SUCCEEDED:
        return state, True, error
    if state in FAILED:
        return state, False, f"{state}: {error}" if error else state
    return None


KIND = job.Kind(kind="SparkApplication", group=GROUP, version=VERSION, plural=PLURAL,
                noun="sparkapplication", outcome=application_state, role="driver",
                selector=f"{APP_NAME_LABEL}={{name}},spark-role=driver",
                pods=f"{APP_NAME_LABEL}={{name}}", again="to run it again",
                thing="application")


@dataclass(frozen=True)
class SparkAppParams:
    """What varies between runs of a Spark step; everything else comes from the template."""

    name: str
    namespace: str
    run_id: str
    image: str
    arguments: tuple[str, ...]  # the vaecf stage's command line (``preprocess --engine ...``)
    secret_name: str = "vaecf-s3"
    driver_cores: int = 1
    driver_memory: str = "4g"
    executors: int = 2
    executor_cores: int = 2
    executor_memory: str = "4g"
    # the driver pod stops this long after it started, even if the step died
    active_deadline_seconds: int | None = None


def validate(params: SparkAppParams) -> None:
    """Refuse bad parameters before anything is created."""
    checks: list[tuple[bool, str]] = [
        (render.dns1035_label(params.name, MAX_NAME),
         f"application name {params.name!r}: expected a DNS-1035 label of <= {MAX_NAME} "
         "characters (the operator refuses others)"),
        *render.resource_checks(params.namespace, params.image, "--secret-name",
                                params.secret_name),
        (1 <= params.executors <= MAX_EXECUTORS,
         f"--executors {params.executors}: expected 1..{MAX_EXECUTORS}"),
        (1 <= params.driver_cores <= 64, f"--driver-cores {params.driver_cores}: expected 1..64"),
        (1 <= params.executor_cores <= 64,
         f"--executor-cores {params.executor_cores}: expected 1..64"),
        (bool(_MEMORY.match(params.driver_memory)),
         f"--driver-memory {params.driver_memory!r}: expected a size such as 512m or 4g"),
        (bool(_MEMORY.match(params.executor_memory)),
         f"--executor-memory {params.executor_memory!r}: expected a size such as 512m or 4g"),
        ((params.active_deadline_seconds or 1) >= 1,
         f"activeDeadlineSeconds {params.active_deadline_seconds}: expected >= 1"),
    ]
    render.refuse_failed(checks)


def default_template() -> Path:
    """``$VAECF_SPARKAPP_TEMPLATE`` (set in the launcher image), else the repository's
    ``manifests/spark/sparkapplication.yaml``."""
    return render.default_template(TEMPLATE_ENV, "spark/sparkapplication.yaml")


def load_template(path: Path) -> dict[str, Any]:
    """The SparkApplication template at ``path``, refused in one line if it is unreadable, of
    another kind, or lacks the driver's or the executors' container."""
    template = render.load_template(path, "SparkApplication")
    try:
        for role in ROLES:
            container(template["spec"], role)
            check_pod_template(template["spec"][role]["template"], role)
    except VaecfError as err:
        raise VaecfError(f"{path}: {err}") from None
    return template


def check_pod_template(template: dict[str, Any], role: str) -> None:
    """Refuse a key a pod template does not have (the operator would drop it silently)."""
    found = pod_fields.unknown_field(template, "V1PodTemplateSpec", f"spec.{role}.template")
    if found is not None:
        raise VaecfError(f"{found}: not a field of a pod template (the Kubernetes API of the "
                         f"kubernetes client {pod_fields.client_version()}); the Spark "
                         "Operator would drop it silently")


def pod_spec(spec: dict[str, Any], role: str) -> dict[str, Any]:
    """The pod template's spec of ``role`` (driver, executor)."""
    try:
        found: dict[str, Any] = spec[role]["template"]["spec"]
    except (KeyError, TypeError) as err:
        raise VaecfError(f"SparkApplication template: no spec.{role}.template.spec") from err
    return found


def container(spec: dict[str, Any], role: str) -> dict[str, Any]:
    """The container Spark fills in for ``role`` (``spark-kubernetes-driver``/``-executor``)."""
    containers = pod_spec(spec, role).get("containers") or []
    for found in containers:
        if isinstance(found, dict) and found.get("name") == ROLES[role]:
            return found
    raise VaecfError(f"SparkApplication template: no {role} container named {ROLES[role]!r} "
                     f"in spec.{role}.template.spec.containers")


def render_app(template: dict[str, Any], params: SparkAppParams) -> dict[str, Any]:
    """The SparkApplication for ``params``: a deep copy of ``template`` with the per-run
    fields set."""
    validate(params)
    app = copy.deepcopy(template)
    metadata = app.setdefault("metadata", {})
    metadata["name"] = params.name
    metadata["namespace"] = params.namespace
    metadata.setdefault("labels", {})[render.RUN_ID_LABEL] = render.run_label(params.run_id)
    spec = app["spec"]
    spec["image"] = params.image
    spec["arguments"] = list(params.arguments)
    sizes = {"driver": (params.driver_cores, params.driver_memory),
             "executor": (params.executor_cores, params.executor_memory)}
    for role, (cores, memory) in sizes.items():
        spec[role].update(cores=cores, coreLimit=str(cores), memory=memory)
        for mount in container(spec, role).get("volumeMounts") or []:
            if mount.get("name") == SCRATCH_VOLUME:
                mount["subPath"] = params.name  # one folder per application
    spec["executor"]["instances"] = params.executors
    for role in ROLES:  # the executors' tasks reach object storage themselves
        for env in container(spec, role).get("env") or []:
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                ref["name"] = params.secret_name
    if params.active_deadline_seconds is not None:
        pod_spec(spec, "driver")["activeDeadlineSeconds"] = params.active_deadline_seconds
    return app
