"""Every MPIJob we ship or render validates against mpi-operator's CRD schema, core kinds
validate against Kubernetes' own schemas (offline), and the security policy holds."""

from __future__ import annotations

import copy
import hashlib
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from vaecf.cli import build_parser
from vaecf.k8s import render

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
CRD = Path(__file__).with_name("schemas") / "mpijob-crd-v2beta1.yaml"  # provenance: its README
K8S_VERSION = "1.30.0"
ROLES = ("Launcher", "Worker")


def crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def json_patch(document: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add/remove/replace/test, enough to apply our kustomize overlays offline."""
    result = copy.deepcopy(document)
    for op in operations:
        *parents, last = [p.replace("~1", "/").replace("~0", "~")
                          for p in op["path"].lstrip("/").split("/")]
        node: Any = result
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key: Any = int(last) if isinstance(node, list) else last
        if op["op"] == "test":
            assert node[key] == op["value"], op
        elif op["op"] == "remove":
            del node[key]
        elif op["op"] in ("replace", "add"):
            node[key] = op["value"]
    return result


def overlay(name: str) -> dict[str, Any]:
    directory = MANIFESTS / "overlays" / name
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../../base"]
    (patch,) = kustomization["patches"]
    assert patch["target"] == {"group": "kubeflow.org", "version": "v2beta1",
                               "kind": "MPIJob", "name": "vaecf-train"}
    base = yaml.safe_load((MANIFESTS / "mpijob.yaml").read_text())
    job = json_patch(base, yaml.safe_load((directory / patch["path"]).read_text()))
    for image in kustomization.get("images", []):  # kustomize's image transformer
        for role in job["spec"]["mpiReplicaSpecs"].values():
            for container in role["template"]["spec"]["containers"]:
                name, _, tag = container["image"].rpartition(":")
                if name == image["name"]:
                    container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
    return job


def params(**change: Any) -> render.MPIJobParams:
    defaults: dict[str, Any] = dict(
        name=render.job_name("run-7"), namespace="team-a", run_id="run-7",
        image="registry.example/ml/vaecf-train@sha256:" + "0" * 64,
        split_uri="s3://vaecf/runs/x/split", model_uri="s3://vaecf/runs/x/model",
        checkpoint_uri="s3://vaecf/runs/x/checkpoints")
    return render.MPIJobParams(**{**defaults, **change})


RENDERED = {
    "2x1-gpu": params(),
    "4x4-gpu": params(workers=4, gpus_per_worker=4, slots_per_worker=4, batch_per_rank=2048,
                      xla=True, nccl_debug="INFO"),
    "3x0-cpu": params(workers=3, gpus_per_worker=0, slots_per_worker=2, batch_per_rank=100,
                      lr_scaling="none", precision="fp32"),
    "1x8-bf16": params(workers=1, gpus_per_worker=8, slots_per_worker=8, lr_scaling="linear",
                       precision="mixed_bfloat16", secret_name="minio-creds"),
}


def all_jobs() -> dict[str, dict[str, Any]]:
    template = render.load_template(MANIFESTS / "mpijob.yaml")
    jobs = {"file": template, "overlay-cpu": overlay("cpu"), "overlay-gpu": overlay("gpu")}
    jobs.update({f"rendered-{k}": render.render(template, p) for k, p in RENDERED.items()})
    return jobs


JOBS = all_jobs()


def pod(job: dict[str, Any], role: str) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]
    return spec


@pytest.mark.parametrize("name", sorted(JOBS))
def test_mpijob_validates_against_the_crd(name) -> None:
    job = JOBS[name]
    jsonschema.validate(job, crd_schema())
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    for role in ROLES:  # the embedded pod templates against the core PodTemplate schema
        template = job["spec"]["mpiReplicaSpecs"][role]["template"]
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate",
                                      "metadata": {"name": role.lower()},
                                      "template": template}, K8S_VERSION, strict=True)


def test_the_crd_copy_is_the_one_its_provenance_names() -> None:
    provenance = (CRD.parent / "README.md").read_text()
    (recorded,) = re.findall(r"SHA-256: ([0-9a-f]{64})", provenance)
    assert hashlib.sha256(CRD.read_bytes()).hexdigest() == recorded
    (version,) = set(re.findall(r"Version: mpi-operator (v[\d.]+)", provenance))
    assert f"/{version}/manifests/base/kubeflow.org_mpijobs.yaml" in provenance
    assert "Apache License" in (CRD.parent / "LICENSE").read_text()
    guide = ROOT / "docs" / "how-to" / "kubeflow-pipeline.md"
    assert f"mpi-operator {version}" in guide.read_text()  # says what it matches


def test_the_crd_check_rejects_a_broken_job() -> None:
    broken = copy.deepcopy(JOBS["file"])
    broken["spec"]["slotsPerWorker"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, crd_schema())


@pytest.mark.parametrize("name", sorted(JOBS))
def test_pods_are_locked_down_and_sized(name) -> None:
    for role in ROLES:
        spec = pod(JOBS[name], role)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        for container in spec["containers"]:
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"] == {"drop": ["ALL"]}
            assert not security.get("privileged", False)
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][kind]), (role, kind)
            for env in container.get("env", []):
                if env["name"].startswith("AWS_") and env["name"] != "AWS_DEFAULT_REGION":
                    assert "value" not in env and "secretKeyRef" in env["valueFrom"]


@pytest.mark.parametrize("name", sorted(JOBS))
def test_pods_mount_no_api_token(name) -> None:
    """mpirun reaches the workers over ssh: no pod of the job talks to the API server."""
    for role in ROLES:
        assert pod(JOBS[name], role)["automountServiceAccountToken"] is False


@pytest.mark.parametrize("name", sorted(JOBS))
def test_workers_have_shm_in_memory_and_launcher_no_gpu(name) -> None:
    worker = pod(JOBS[name], "Worker")
    (mount,) = [m for m in worker["containers"][0]["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    (volume,) = [v for v in worker["volumes"] if v["name"] == mount["name"]]
    assert volume["emptyDir"]["medium"] == "Memory"
    launcher = pod(JOBS[name], "Launcher")["containers"][0]["resources"]
    assert all(render.GPU_RESOURCE not in launcher[k] for k in ("requests", "limits"))


@pytest.mark.parametrize("name", sorted(JOBS))
def test_no_service_mesh_sidecar_in_mpi_pods(name) -> None:
    for role in ROLES:
        template = JOBS[name]["spec"]["mpiReplicaSpecs"][role]["template"]
        assert template["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"


@pytest.mark.parametrize("name", sorted(JOBS))
def test_mpirun_world_matches_the_job_and_train_flags_parse(name) -> None:
    job = JOBS[name]
    workers = job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    slots = job["spec"]["slotsPerWorker"]
    gpus = pod(job, "Worker")["containers"][0]["resources"]["limits"].get(render.GPU_RESOURCE)
    assert gpus in (None, str(slots))  # one rank per GPU
    assert ("tolerations" in pod(job, "Worker")) == (gpus is not None)
    launcher = pod(job, "Launcher")["containers"][0]
    assert launcher["command"] == ["mpirun"]
    args = launcher["args"]
    assert args[args.index("-np") + 1] == str(workers * slots)
    command = args[args.index("vaecf"):]
    assert command[:2] == ["vaecf", "train"]
    train = build_parser("train").parse_args(command[2:])
    assert (train.expect_world_size, train.expect_hosts) == (workers * slots, workers)
    assert train.batch_size % (workers * slots) == 0  # the trainer splits the global batch
    # The global batch and learning rate are explicit numbers, following the rule the job
    # was made with (the shipped files: the defaults, vaecf.k8s.render).
    made = RENDERED.get(name.removeprefix("rendered-"), params(
        workers=workers, slots_per_worker=slots, gpus_per_worker=int(gpus or 0)))
    assert (train.batch_size, train.learning_rate) == (made.batch_size, made.learning_rate)
    if name.startswith("rendered-"):
        assert train.batch_size == made.batch_per_rank * workers * slots
    # NCCL_DEBUG is set in the launcher's env (visible, overridable) and forwarded by name.
    assert args[args.index("NCCL_DEBUG") - 1] == "-x"
    assert not any(arg.startswith("NCCL_DEBUG=") for arg in args)
    env = {e["name"]: e.get("value") for e in launcher["env"]}
    assert env["NCCL_DEBUG"] == (made.nccl_debug if name.startswith("rendered-") else "WARN")
    assert train.split.startswith("s3://") and train.output.startswith("s3://")
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        assert args[args.index(variable) - 1] == "-x"  # forwarded to the ranks over ssh


def test_rendered_jobs_carry_their_parameters() -> None:
    job = JOBS["rendered-1x8-bf16"]
    assert job["metadata"]["name"] == "vaecf-train-run-7"
    assert job["metadata"]["labels"][render.RUN_ID_LABEL] == "run-7"
    refs = {e["valueFrom"]["secretKeyRef"]["name"]
            for e in pod(job, "Launcher")["containers"][0]["env"] if "valueFrom" in e}
    assert refs == {"minio-creds"}
    assert {c["image"] for r in ROLES for c in pod(job, r)["containers"]} == {
        RENDERED["1x8-bf16"].image}
    assert "--xla" in pod(JOBS["rendered-4x4-gpu"], "Launcher")["containers"][0]["args"]
    assert "--compression" not in pod(job, "Launcher")["containers"][0]["args"]  # none
    fp16 = render.train_command(params(workers=4, compression="fp16"))
    assert fp16[fp16.index("--compression") + 1] == "fp16"
    # The GPU defaults measured on an H100 (README "Results"); --xla false leaves XLA off.
    assert fp16[fp16.index("--precision") + 1] == "mixed_bfloat16" and "--xla" in fp16
    assert "--xla" not in render.train_command(params(xla=False))


def test_a_trials_learning_rate_replaces_the_scaled_one() -> None:
    scaled = render.train_command(params(workers=4))
    assert scaled[scaled.index("--learning-rate") + 1] == str(params(workers=4).learning_rate)
    trial = render.train_command(params(workers=4, train_flags=("--learning-rate", "0.003")))
    assert trial.count("--learning-rate") == 1
    assert trial[trial.index("--learning-rate") + 1] == "0.003"


@pytest.mark.parametrize("forward", [["-x", "NCCL_DEBUG=WARN"], []])
def test_nccl_debug_comes_from_the_env_whatever_the_template_forwards(forward) -> None:
    # An older template forwarding NCCL_DEBUG=WARN by value, or one not forwarding it: the
    # rank's NCCL_DEBUG is the launcher env's, which the job sets.
    template = render.load_template(MANIFESTS / "mpijob.yaml")
    launcher = pod(template, "Launcher")["containers"][0]
    at = launcher["args"].index("NCCL_DEBUG")
    launcher["args"][at - 1:at + 1] = forward
    launcher["env"] = [e for e in launcher["env"] if e["name"] != "NCCL_DEBUG"]
    job = render.render(template, params(nccl_debug="INFO"))
    rendered = pod(job, "Launcher")["containers"][0]
    args = rendered["args"][:rendered["args"].index("vaecf")]
    assert [args[i + 1] for i, a in enumerate(args) if a == "-x"].count("NCCL_DEBUG") == 1
    assert not any(a.startswith("NCCL_DEBUG=") for a in args)
    assert {"name": "NCCL_DEBUG", "value": "INFO"} in rendered["env"]


def rbac() -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all((MANIFESTS / "base" / "rbac.yaml").read_text()))
    return {doc["kind"]: doc for doc in docs}


def test_rbac_validates_and_grants_exactly_what_the_launcher_uses() -> None:
    docs = rbac()
    assert set(docs) == {"ServiceAccount", "Role", "RoleBinding"}
    for doc in docs.values():
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    granted = {(group, resource, verb) for rule in docs["Role"]["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}
    # what the step calls, no more (tests/k8s checks every request against this Role)
    assert granted == {
        *(("kubeflow.org", "mpijobs", v) for v in ("create", "get", "watch", "delete")),
        ("", "pods", "list"), ("", "pods/log", "get"), ("", "events", "list")}
    assert not any("*" in part for grant in granted for part in grant)
    assert not {r for _, r, _ in granted} & {"secrets", "pods/exec", "pods/attach"}
    binding = docs["RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": docs["Role"]["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount",
                                    "name": docs["ServiceAccount"]["metadata"]["name"]}]


def test_kustomizations_reference_existing_files() -> None:
    base = yaml.safe_load((MANIFESTS / "base" / "kustomization.yaml").read_text())
    assert base["resources"] == ["rbac.yaml", "mpijob.yaml"]
    assert all((MANIFESTS / "base" / r).is_file() for r in base["resources"])
    assert (MANIFESTS / "mpijob.yaml").resolve() == (MANIFESTS / "base" / "mpijob.yaml")
    assert render.default_template().resolve() == (MANIFESTS / "base" / "mpijob.yaml")


def test_cpu_overlay_runs_the_cpu_flavour_of_the_train_image() -> None:
    for role in ("Launcher", "Worker"):
        (container,) = pod(JOBS["overlay-cpu"], role)["containers"]
        assert container["image"] == "ghcr.io/vaecf/vaecf-train-cpu:0.1.0"
        (container,) = pod(JOBS["overlay-gpu"], role)["containers"]
        assert container["image"] == "ghcr.io/vaecf/vaecf-train:0.1.0"
