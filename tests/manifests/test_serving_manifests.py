"""manifests/serving, offline: core kinds and the predictor's pod against Kubernetes' own
schemas, the security policy, probes on the server's real endpoints, args that `vaecf serve`
parses, and RBAC that grants exactly what `vaecf deploy` uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from vaecf.cli import build_parser
from vaecf.k8s import inferenceservice

SERVING = Path(__file__).resolve().parents[2] / "manifests" / "serving"
K8S_VERSION = "1.30.0"


def load(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((SERVING / name).read_text()))


def services() -> dict[str, dict[str, Any]]:
    rendered = inferenceservice.render_service(
        load("inferenceservice.yaml")[0],
        inferenceservice.ServiceParams(name="recs", namespace="team-a", run_id="run-7",
                                       image="registry.example/ml/vaecf-serve:0.2.0",
                                       storage_uri="s3://models/runs/vaecf-train-run-7/model"))
    return {"file": load("inferenceservice.yaml")[0], "rendered": rendered}


@pytest.mark.parametrize("name", ["file", "rendered"])
def test_predictor_pod_validates_and_is_locked_down(name: str) -> None:
    service = services()[name]
    assert (service["apiVersion"], service["kind"]) == ("serving.kserve.io/v1beta1",
                                                        "InferenceService")
    predictor = service["spec"]["predictor"]
    pod = {key: predictor[key] for key in ("containers", "securityContext",
                                           "serviceAccountName")}
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate",
                                  "metadata": {"name": "predictor"},
                                  "template": {"spec": pod}}, K8S_VERSION, strict=True)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    (container,) = pod["containers"]
    assert container["name"] == "kserve-container"
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]} and security["privileged"] is False
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind])
    storage = [e for e in container["env"] if e["name"] == "STORAGE_URI"]
    assert len(storage) == 1 and storage[0]["value"].startswith("s3://")
    assert not any(e["name"].startswith("AWS_") for e in container["env"])  # SA's Secret


@pytest.mark.parametrize("name", ["file", "rendered"])
def test_args_parse_and_probes_hit_the_server_s_endpoints(name: str) -> None:
    (container,) = services()[name]["spec"]["predictor"]["containers"]
    assert container["args"][0] == "serve"
    args = build_parser("serve").parse_args(container["args"][1:])
    assert args.model == "/mnt/models"  # where KServe's storage initializer puts STORAGE_URI
    assert container["ports"] == [{"name": "http1", "containerPort": args.http_port,
                                   "protocol": "TCP"}]
    ready = container["readinessProbe"]["httpGet"]
    assert (ready["path"], ready["port"]) == (f"/v1/models/{args.model_name}", args.http_port)
    assert container["livenessProbe"]["httpGet"] == {"path": "/", "port": args.http_port}
    assert args.grace_period < 30  # inside the pod's default terminationGracePeriodSeconds


def test_tf_serving_variant_is_locked_down_and_reads_s3() -> None:
    (service,) = load("inferenceservice-tfserving.yaml")
    predictor = service["spec"]["predictor"]
    model = predictor["model"]
    assert model["modelFormat"] == {"name": "tensorflow"}
    assert model["storageUri"].startswith("s3://")
    assert predictor["serviceAccountName"] == "vaecf-serve"
    assert predictor["securityContext"]["runAsNonRoot"] is True
    assert model["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {"cpu", "memory"} <= set(model["resources"]["limits"])


def test_service_account_and_rbac_grant_exactly_what_deploy_uses() -> None:
    (account,) = load("serviceaccount.yaml")
    role, binding = load("rbac.yaml")
    for doc in (account, role, binding):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert account["automountServiceAccountToken"] is False
    assert account["secrets"] == [{"name": "vaecf-s3"}]
    granted = {(group, resource, verb) for rule in role["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}
    assert granted == {("serving.kserve.io", "inferenceservices", v)
                       for v in ("get", "create", "patch")}
    launcher = next(d for d in yaml.safe_load_all(
        (SERVING.parent / "base" / "rbac.yaml").read_text()) if d["kind"] == "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount",
                                    "name": launcher["metadata"]["name"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_kustomization_lists_existing_files_and_the_template_is_the_default() -> None:
    kustomization = yaml.safe_load((SERVING / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["serviceaccount.yaml", "rbac.yaml",
                                          "inferenceservice.yaml"]
    assert all((SERVING / name).is_file() for name in kustomization["resources"])
    assert inferenceservice.default_template() == SERVING / "inferenceservice.yaml"
