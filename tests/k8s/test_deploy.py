"""``vaecf deploy`` against the fake Kubernetes API server on loopback (real HTTP, the real
``kubernetes`` client) and a real S3 server (moto) holding the trained model."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import FakeApiServer, Scenario
from test_launch_mpijob import JOB, RUN_ID, publish_model

from vaecf.errors import VaecfError
from vaecf.io import publish, write_manifest
from vaecf.io.storage import download_dir
from vaecf.k8s import inferenceservice, render

IMAGE = "ghcr.io/vaecf/vaecf-serve:0.1.0"
SERVICES = "/apis/serving.kserve.io/v1beta1/namespaces/team-a/inferenceservices"


@pytest.fixture()
def env(tmp_path: Path, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    store = f"s3://{s3_bucket}/runs"
    publish_model(f"{store}/{JOB}/model")
    download_dir(f"{store}/{JOB}/model", tmp_path / "model")  # the step's input artifact
    server = FakeApiServer(Scenario())
    monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    return {"tmp": tmp_path, "store": store, "model": tmp_path / "model", "server": server}


def argv(env: dict[str, Any], *extra: str) -> list[str]:
    return ["deploy", "--model", str(env["model"]), "--store", env["store"], "--run-id", RUN_ID,
            "--image", IMAGE, "--namespace", "team-a", *extra]


def container(service: dict[str, Any]) -> dict[str, Any]:
    (only,) = service["spec"]["predictor"]["containers"]
    return dict(only)


def test_creates_the_service_then_patches_it_to_a_new_model(env, cli) -> None:
    with env["server"] as server:
        code, out, err = cli(*argv(env))
        assert code == 0, err
        assert "created inferenceservice team-a/vaecf" in out
        service = server.cluster.services["vaecf"]
        assert service["metadata"]["labels"][render.RUN_ID_LABEL] == RUN_ID
        assert service["spec"]["predictor"]["serviceAccountName"] == "vaecf-serve"
        assert container(service)["image"] == IMAGE
        assert container(service)["env"][0] == {
            "name": "STORAGE_URI", "value": f"{env['store']}/{JOB}/model"}

        code, out, err = cli(*argv(env, "--image", "ghcr.io/vaecf/vaecf-serve:0.2.0"))
        assert code == 0, err
        assert "updated inferenceservice team-a/vaecf" in out
    assert container(server.cluster.services["vaecf"])["image"].endswith(":0.2.0")
    assert [r.method for r in server.cluster.requests] == ["GET", "POST", "GET", "PATCH"]
    assert all(r.path.startswith(SERVICES) for r in server.cluster.requests)


def test_a_model_other_than_the_stored_one_is_refused_before_the_cluster(env, cli) -> None:
    other = env["tmp"] / "other"
    with publish(str(other), "train_manifest.json") as staging:
        (staging / "saved_model.pb").write_bytes(b"another graph")
        write_manifest(staging, "train", inputs={}, parameters={}, counts={},
                       started=time.monotonic())
    with env["server"] as server:
        code, _, err = cli(*argv(env)[:2], str(other), *argv(env)[3:])
    assert code == 1
    assert err == (f"vaecf deploy: error: {env['store']}/{JOB}/model: holds another model "
                   f"than --model {other} (their train_manifest.json files differ)\n")
    assert server.cluster.requests == []


@pytest.mark.parametrize(("extra", "message"), [
    (("--image", "Not An Image"), "--image 'Not An Image': expected registry/name"),
    (("--name", "Vaecf"), "--name 'Vaecf': expected a DNS-1035 label"),
    (("--store", "/local/runs"), "--store '/local/runs': expected an s3:// prefix"),
])
def test_bad_flags_fail_in_one_line_with_nothing_sent(env, cli, extra, message) -> None:
    with env["server"] as server:
        code, _, err = cli(*argv(env, *extra))
    assert code == 1 and err.startswith(f"vaecf deploy: error: {message}"), err
    assert err.count("\n") == 1
    assert server.cluster.requests == []


def test_a_template_of_another_kind_fails_in_one_line_with_nothing_sent(env, cli) -> None:
    mpijob = render.default_template()  # an applicable manifest, but not an InferenceService
    with env["server"] as server:
        code, _, err = cli(*argv(env, "--template", str(mpijob)))
    assert (code, err) == (1, f"vaecf deploy: error: {mpijob}: not an InferenceService "
                              "manifest\n")
    assert server.cluster.requests == []


def test_rendering_keeps_the_template_s_policy() -> None:
    template = inferenceservice.load_template(inferenceservice.default_template())
    params = inferenceservice.ServiceParams(name="recs", namespace="ns", run_id="r 1",
                                            image=IMAGE, storage_uri="s3://bucket/m")
    service = inferenceservice.render_service(template, params)
    spec = container(service)
    assert spec["args"][spec["args"].index("--model_name") + 1] == "recs"
    assert spec["readinessProbe"]["httpGet"]["path"] == "/v1/models/recs"
    assert [e for e in spec["env"] if e["name"] == "STORAGE_URI"] == [
        {"name": "STORAGE_URI", "value": "s3://bucket/m"}]
    assert spec["securityContext"] == container(template)["securityContext"]
    assert spec["resources"] == container(template)["resources"]
    assert service["metadata"]["labels"][render.RUN_ID_LABEL] == "r-1"


@pytest.mark.parametrize("name", ["recs\n", "Recs", "1recs", "recs-", "r" * 46])
def test_a_service_name_is_a_whole_dns1035_label(name: str) -> None:
    # "recs\n" passed the old check: its regex's "$" matches before a final newline.
    params = inferenceservice.ServiceParams(name=name, namespace="ns", run_id="r",
                                            image=IMAGE, storage_uri="s3://bucket/m")
    with pytest.raises(VaecfError, match="expected a DNS-1035 label"):
        inferenceservice.validate(params)
    inferenceservice.validate(dataclasses.replace(params, name="recs-2"))


def test_unknown_template_fields_are_refused_and_warnings_shown(env, cli) -> None:
    """Create and patch go with strict field validation: a misspelt field of an edited
    template is refused in one line naming it (as kubectl apply does), not silently dropped;
    the server's warnings are shown."""
    template = inferenceservice.load_template(inferenceservice.default_template())
    template["spec"]["transfomer"] = {"containers": []}  # transformer, misspelt
    path = env["tmp"] / "isvc.yaml"
    path.write_text(json.dumps(template))
    env["server"].cluster.scenario.warnings = ["spec.predictor.minReplicas: 0 scales to zero"]
    with env["server"] as server:
        code, _, err = cli(*argv(env, "--template", str(path)))
        assert (code, err) == (1, 'vaecf deploy: error: inferenceservice team-a/vaecf: create '
                                  'failed: HTTP 400 Bad Request: InferenceService in version '
                                  '"v1beta1" cannot be handled as a InferenceService: strict '
                                  'decoding error: unknown field "spec.transfomer"\n')
        assert server.cluster.services == {}
        code, out, err = cli(*argv(env))
        assert code == 0, err
        code, out, err = cli(*argv(env))  # the patch
        assert code == 0, err
    assert ("inferenceservice team-a/vaecf: patch: the API server warns: "
            "spec.predictor.minReplicas: 0 scales to zero\n") in out
    sent = [r for r in server.cluster.requests if r.method in ("POST", "PATCH")]
    assert [r.query.get("fieldValidation") for r in sent] == ["Strict"] * 3
