"""manifests/spark, offline: the SparkApplication template and every one `vaecf launch-sparkapp`
renders against the Spark Operator's CRD schema, their pod templates against Kubernetes' own
schema, the security policy, and RBAC that grants the launcher and Spark's driver only what
they call."""

from __future__ import annotations

import copy
import functools
import hashlib
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from vaecf.cli import build_parser
from vaecf.k8s import sparkapp

ROOT = Path(__file__).resolve().parents[2]
SPARK = ROOT / "manifests" / "spark"
CRD = Path(__file__).with_name("schemas") / "sparkapplication-crd-v1beta2.yaml"
PROVENANCE = CRD.with_suffix(".md")
K8S_VERSION = "1.30.0"
ROLES = ("driver", "executor")


@functools.cache
def crd_schema() -> dict[str, Any]:
    """The CRD's schema, read once (libyaml when there is one: the file is 0.8 MB)."""
    crd = yaml.load(CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1beta2"
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def params(**change: Any) -> sparkapp.SparkAppParams:
    defaults: dict[str, Any] = dict(
        name="vaecf-split-run-7", namespace="team-a", run_id="run-7",
        image="registry.example/ml/vaecf-spark@sha256:" + "0" * 64,
        arguments=("split", "--engine", "spark", "--input", "s3://b/r/i", "--output",
                   "s3://b/r/o", "--protocol", "mission", "--seed", "7"))
    return sparkapp.SparkAppParams(**{**defaults, **change})


def all_apps() -> dict[str, dict[str, Any]]:
    template = sparkapp.load_template(SPARK / "sparkapplication.yaml")
    return {"file": template,
            "rendered-default": sparkapp.render_app(template, params()),
            "rendered-large": sparkapp.render_app(template, params(
                executors=40, executor_cores=8, executor_memory="28g", driver_cores=4,
                driver_memory="16g", secret_name="minio-creds", active_deadline_seconds=7200))}


APPS = all_apps()


@pytest.mark.parametrize("name", sorted(APPS))
def test_application_validates_against_the_crd_and_core_schemas(name) -> None:
    app = APPS[name]
    jsonschema.validate(app, crd_schema())
    assert (app["apiVersion"], app["kind"]) == ("sparkoperator.k8s.io/v1beta2",
                                                "SparkApplication")
    for role in ROLES:  # the CRD keeps pod templates as they are: Kubernetes' schema checks
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate",
                                      "metadata": {"name": role},
                                      "template": app["spec"][role]["template"]},
                                     K8S_VERSION, strict=True)


def test_the_crd_check_rejects_a_broken_application() -> None:
    broken = copy.deepcopy(APPS["file"])
    broken["spec"]["restartPolicy"]["type"] = "Sometimes"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, crd_schema())


def test_the_crd_copy_is_the_one_its_provenance_names() -> None:
    provenance = PROVENANCE.read_text()
    (recorded,) = re.findall(r"SHA-256: ([0-9a-f]{64})", provenance)
    assert hashlib.sha256(CRD.read_bytes()).hexdigest() == recorded
    (version,) = set(re.findall(r"Version: spark-operator (v[\d.]+)", provenance))
    assert (f"/{version}/charts/spark-operator-chart/crds/"
            "sparkoperator.k8s.io_sparkapplications.yaml") in provenance
    assert "Apache License" in (CRD.parent / "LICENSE").read_text()
    guide = ROOT / "docs" / "how-to" / "spark-on-kubernetes.md"
    assert f"spark-operator {version}" in guide.read_text()


@pytest.mark.parametrize("name", sorted(APPS))
def test_the_application_is_a_python_stage_in_cluster_mode(name) -> None:
    spec = APPS[name]["spec"]
    assert (spec["type"], spec["mode"], spec["restartPolicy"]) == (
        "Python", "cluster", {"type": "Never"})  # the launcher owns retries
    assert spec["mainApplicationFile"] == "local:///opt/vaecf/main.py"
    pinned = re.search(r"^pyspark==([\d.]+)$", (ROOT / "requirements.lock").read_text(), re.M)
    assert pinned is not None and spec["sparkVersion"] == pinned.group(1)
    assert spec["sparkVersion"].startswith("4.0.")
    arguments = spec["arguments"]
    stage = build_parser(arguments[0]).parse_args(arguments[1:])
    assert stage.engine == "spark"
    assert stage.input.startswith("s3://") and stage.output.startswith("s3://")
    conf = spec["sparkConf"]
    assert all(isinstance(v, str) for v in conf.values())
    assert conf["spark.kubernetes.driver.ownPersistentVolumeClaim"] == "false"  # no PVC grant
    assert conf["spark.kubernetes.driver.service.deleteOnTermination"] == "true"
    # the operator refuses these in sparkConf (its webhook's denied keys)
    assert not {"spark.master", "spark.kubernetes.container.image"} & set(conf)
    assert not any(k.startswith("spark.kubernetes.authenticate") for k in conf)


@pytest.mark.parametrize("name", sorted(APPS))
def test_pods_are_non_root_locked_down_and_sized(name) -> None:
    spec = APPS[name]["spec"]
    for role in ROLES:
        pod = sparkapp.pod_spec(spec, role)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 185  # Spark's convention
        container = sparkapp.container(spec, role)
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert spec[role]["cores"] >= 1 and re.fullmatch(r"\d+[mg]", spec[role]["memory"])
        assert str(spec[role]["cores"]) == spec[role]["coreLimit"]
        assert pod_annotation(spec, role) == "false"
    assert spec["executor"]["instances"] >= 1
    assert spec["driver"]["serviceAccount"] == "vaecf-spark-driver"
    assert sparkapp.pod_spec(spec, "executor")["automountServiceAccountToken"] is False
    assert sparkapp.pod_spec(spec, "driver")["activeDeadlineSeconds"] >= 1


def pod_annotation(spec: dict[str, Any], role: str) -> str:
    return str(spec[role]["template"]["metadata"]["annotations"]["sidecar.istio.io/inject"])


@pytest.mark.parametrize("name", sorted(APPS))
def test_driver_and_executors_read_the_same_secret_by_reference(name) -> None:
    """The executors' tasks read and write object storage themselves: the same Secret."""
    spec = APPS[name]["spec"]
    for role in ROLES:
        env = {e["name"]: e for e in sparkapp.container(spec, role)["env"]}
        for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
            assert "value" not in env[variable]
            assert env[variable]["valueFrom"]["secretKeyRef"]["key"] == variable
        refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in env.values() if "valueFrom" in e}
        assert refs == {"minio-creds" if name == "rendered-large" else "vaecf-s3"}, role
    # no pod-spec fields that only the operator's mutating webhook applies
    for role in ROLES:
        assert not {"env", "envFrom", "volumeMounts", "securityContext", "podSecurityContext",
                    "secrets", "configMaps"} & set(spec[role])
    assert "volumes" not in spec


@pytest.mark.parametrize("name", sorted(APPS))
def test_no_pod_needs_a_shared_volume(name) -> None:
    """The driver stages on its own disk (an emptyDir, its $TMPDIR); the executors mount
    nothing: no ReadWriteMany volume is needed (``scratch.yaml`` is the optional one)."""
    spec = APPS[name]["spec"]
    (volume,) = sparkapp.pod_spec(spec, "driver")["volumes"]
    assert volume == {"name": sparkapp.SCRATCH_VOLUME, "emptyDir": {}}
    (mount,) = sparkapp.container(spec, "driver")["volumeMounts"]
    tmpdir = {e["name"]: e.get("value") for e in sparkapp.container(spec, "driver")["env"]}
    assert tmpdir["TMPDIR"] == mount["mountPath"]
    assert not sparkapp.pod_spec(spec, "executor").get("volumes")
    assert not sparkapp.container(spec, "executor").get("volumeMounts")
    (claim,) = yaml.safe_load_all((SPARK / "scratch.yaml").read_text())
    assert "ReadWriteMany" in claim["spec"]["accessModes"]
    kubernetes_validate.validate(claim, K8S_VERSION, strict=True)


def roles() -> dict[str, dict[str, Any]]:
    return {f"{d['kind']}/{d['metadata']['name']}": d
            for d in yaml.safe_load_all((SPARK / "rbac.yaml").read_text())}


def grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def test_rbac_grants_the_launcher_and_the_driver_only_what_they_call() -> None:
    docs = roles()
    for doc in docs.values():
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert grants(docs["Role/vaecf-spark-launcher"]) == {
        ("sparkoperator.k8s.io", "sparkapplications", v)
        for v in ("create", "get", "watch", "delete")}
    assert grants(docs["Role/vaecf-spark-driver"]) == {
        *(("", "pods", v) for v in ("create", "get", "list", "watch", "patch", "delete",
                                    "deletecollection")),
        ("", "configmaps", "create"), ("", "configmaps", "deletecollection"),
        ("", "services", "deletecollection")}
    for name in ("vaecf-spark-launcher", "vaecf-spark-driver"):
        granted = grants(docs[f"Role/{name}"])
        assert not any("*" in part for grant in granted for part in grant)
        assert not {r for _, r, _ in granted} & {"secrets", "pods/exec", "pods/attach",
                                                 "persistentvolumeclaims"}
        binding = docs[f"RoleBinding/{name}"]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": name}
    assert docs["RoleBinding/vaecf-spark-launcher"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "vaecf-launcher"}]  # manifests/base's
    assert docs["RoleBinding/vaecf-spark-driver"]["subjects"] == [
        {"kind": "ServiceAccount", "name": APPS["file"]["spec"]["driver"]["serviceAccount"]}]


def test_kustomization_references_existing_files() -> None:
    kustomization = yaml.safe_load((SPARK / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["rbac.yaml"]
    assert all((SPARK / r).is_file() for r in kustomization["resources"])
    assert sparkapp.default_template().resolve() == SPARK / "sparkapplication.yaml"


def test_a_template_without_the_driver_container_is_refused(tmp_path) -> None:
    from vaecf.errors import VaecfError

    template = copy.deepcopy(APPS["file"])
    sparkapp.container(template["spec"], "driver")["name"] = "main"
    path = tmp_path / "app.yaml"
    path.write_text(yaml.safe_dump(template))
    with pytest.raises(VaecfError, match="no driver container named 'spark-kubernetes-driver'"):
        sparkapp.load_template(path)
