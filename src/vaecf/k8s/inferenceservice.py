"""Render the vaecf InferenceService (serving.kserve.io/v1beta1) and create or update it.

The template is ``manifests/serving/inferenceservice.yaml``, itself an applicable service;
``render`` changes only what varies per deployment (name, namespace, run label, image, the
model's ``STORAGE_URI``, ServiceAccount, ``--model_name``) and keeps resources, probes and
security settings as written. ``apply`` uses only the verbs of ``manifests/serving/rbac.yaml``:
get, then create (absent) or a merge patch (present).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vaecf.errors import VaecfError
from vaecf.io.storage import is_s3, split_s3
from vaecf.k8s import client, render

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
TEMPLATE_ENV = "VAECF_INFERENCESERVICE_TEMPLATE"
STORAGE_URI = "STORAGE_URI"


@dataclass(frozen=True)
class ServiceParams:
    """What varies between deployments; everything else comes from the template."""

    name: str
    namespace: str
    run_id: str
    image: str
    storage_uri: str
    service_account: str = "vaecf-serve"


def default_template() -> Path:
    """``$VAECF_INFERENCESERVICE_TEMPLATE`` (set in the launcher image), else the repo's."""
    return render.default_template(TEMPLATE_ENV, "serving/inferenceservice.yaml")


def validate(params: ServiceParams) -> None:
    """Refuse bad parameters before anything reaches the cluster."""
    checks = [
        (render.dns1035_label(params.name, 45),
         f"--name {params.name!r}: expected a DNS-1035 label of at most 45 characters "
         "(KServe appends '-predictor-...' to it)"),
        *render.resource_checks(params.namespace, params.image, "--service-account",
                                params.service_account),
        (is_s3(params.storage_uri),
         f"model {params.storage_uri!r}: KServe's storage initializer needs an s3:// URI"),
    ]
    render.refuse_failed(checks)
    split_s3(params.storage_uri)  # raises on a malformed bucket


def render_service(template: dict[str, Any], params: ServiceParams) -> dict[str, Any]:
    """The InferenceService for ``params``: a deep copy of ``template`` (``load_template``'s,
    its kind checked) with its fields set."""
    validate(params)
    service = copy.deepcopy(template)
    metadata = service.setdefault("metadata", {})
    metadata["name"], metadata["namespace"] = params.name, params.namespace
    metadata.setdefault("labels", {})[render.RUN_ID_LABEL] = render.run_label(params.run_id)
    predictor = service["spec"]["predictor"]
    predictor["serviceAccountName"] = params.service_account
    (container,) = _containers(service, "InferenceService template")
    container["image"] = params.image
    args = container.setdefault("args", [])
    if "--model_name" in args:
        args[args.index("--model_name") + 1] = params.name
    probe = container.get("readinessProbe", {}).get("httpGet")
    if probe is not None:
        probe["path"] = f"/v1/models/{params.name}"
    env = [e for e in container.get("env", []) if e.get("name") != STORAGE_URI]
    container["env"] = [{"name": STORAGE_URI, "value": params.storage_uri}, *env]
    return service


def _containers(service: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The predictor's one container (a mapping), or one line saying what the template lacks."""
    predictor = service["spec"].get("predictor")
    containers = predictor.get("containers") if isinstance(predictor, dict) else None
    if not (isinstance(containers, list) and len(containers) == 1
            and isinstance(containers[0], dict)):
        raise VaecfError(f"{where}: expected one predictor container (a mapping)")
    return containers


def load_template(path: Path) -> dict[str, Any]:
    template = render.load_template(path, "InferenceService")
    _containers(template, str(path))
    return template


def apply(api_client: Any, service: dict[str, Any], budget: float = 300.0) -> str:
    """Create the service, or merge-patch an existing one; returns "created" or "updated".

    Both are sent with strict field validation (a misspelt field in an edited template is
    refused, naming the field, as ``kubectl apply`` does) and the server's warnings are
    logged; transient failures are retried within ``budget`` seconds."""
    from kubernetes import client as k8s

    custom = k8s.CustomObjectsApi(api_client)
    namespace, name = service["metadata"]["namespace"], service["metadata"]["name"]
    ref = f"inferenceservice {namespace}/{name}"
    try:
        client.call(f"{ref}: get", custom.get_namespaced_custom_object, GROUP, VERSION,
                    namespace, PLURAL, name, budget=budget)
        exists = True
    except client.ApiError as err:
        if err.status != 404:
            raise
        exists = False
    if exists:
        client.send(f"{ref}: patch", custom.patch_namespaced_custom_object_with_http_info,
                    GROUP, VERSION, namespace, PLURAL, name, service, budget=budget)
    else:
        client.send(f"{ref}: create", custom.create_namespaced_custom_object_with_http_info,
                    GROUP, VERSION, namespace, PLURAL, service, budget=budget)
    return "updated" if exists else "created"
