"""``vaecf launch-sparkapp`` against the fake Kubernetes API server on loopback (real HTTP, the
real ``kubernetes`` client) playing the Spark Operator's part, and a real S3 server (moto)
holding the staged input and the output the driver publishes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_apiserver import FakeApiServer, Scenario, crd_schema, sigterm_once_watching

from vaecf.cli import build_parser
from vaecf.io import publish, read_manifest, storage, write_manifest
from vaecf.k8s import sparkapp

RUN_ID = "2f0c1a9e-6a4b-4b3e-9d8e-0123456789ab"
APP = {"preprocess": f"vaecf-preprocess-{RUN_ID}", "split": f"vaecf-split-{RUN_ID}"}
IMAGE = "ghcr.io/vaecf/vaecf-spark:0.1.0"
READS = {"preprocess": "download", "split": "preprocess"}
WRITES = {"preprocess": ("preprocess", "interactions.parquet"),
          "split": ("dataset", "train.npz")}
ROOT = Path(__file__).resolve().parents[2]


def stage_input(root: Path, stage: str) -> Path:
    """The smallest directory the step accepts as its input: a file + its manifest."""
    folder = root / f"{stage}-input"
    folder.mkdir()
    (folder / "data.bin").write_bytes(b"not read by the launcher")
    write_manifest(folder, READS[stage], inputs={}, parameters={}, counts={},
                   started=time.monotonic())
    return folder


def argument(app: dict[str, Any], flag: str) -> str:
    arguments = app["spec"]["arguments"]
    return str(arguments[arguments.index(flag) + 1])


def driver_publishes(app: dict[str, Any]) -> None:
    """What a driver that succeeds leaves in object storage: the stage's published output."""
    stage = app["spec"]["arguments"][0]
    manifest, name = WRITES[stage]
    with publish(argument(app, "--output"), f"{manifest}_manifest.json") as staging:
        (staging / name).write_bytes(b"made by spark")
        write_manifest(staging, manifest, inputs={}, parameters={}, counts={"rows": 3},
                       started=time.monotonic(), extra={"engine": "spark"})


@pytest.fixture()
def env(tmp_path: Path, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return {"tmp": tmp_path, "bucket": s3_bucket, "output": tmp_path / "out",
            "store": f"s3://{s3_bucket}/runs"}


def argv(env: dict[str, Any], *extra: str, stage: str = "preprocess") -> list[str]:
    source = env.get(stage) or stage_input(env["tmp"], stage)
    env[stage] = source
    return ["launch-sparkapp", "--stage", stage, "--input", str(source),
            "--output", str(env["output"]), "--store", env["store"], "--run-id", RUN_ID,
            "--image", IMAGE, "--namespace", "team-a", "--executors", "3", *extra]


def serve(env: dict[str, Any], monkeypatch: pytest.MonkeyPatch, **scenario: Any
          ) -> FakeApiServer:
    server = FakeApiServer(Scenario(kind="sparkapplications", **scenario))
    monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(env["tmp"] / "kubeconfig")))
    return server


@pytest.mark.parametrize("stage", ["preprocess", "split"])
def test_completed_streams_the_driver_log_and_publishes_the_output(env, cli, monkeypatch,
                                                                   stage) -> None:
    with serve(env, monkeypatch, states=["SUBMITTED", "RUNNING", "COMPLETED"],
               log_lines=["spark: started Spark 4.0.5, master k8s://https://kubernetes",
                          "ml-20m: 9,990,682 positives"],
               on_create=driver_publishes) as server:
        code, out, err = cli(*argv(env, stage=stage))
    assert code == 0, err
    assert "spark: started Spark 4.0.5, master k8s://https://kubernetes\n" in out
    manifest, name = WRITES[stage]
    assert read_manifest(env["output"], manifest)["engine"] == "spark"
    assert (env["output"] / name).read_bytes() == b"made by spark"
    (post,) = server.cluster.seen("POST", "/namespaces/team-a/sparkapplications")
    app = post.body
    assert app is not None and app["metadata"]["name"] == APP[stage]
    assert all(r.query.get("fieldValidation") == "Strict" for r in server.cluster.seen("POST"))
    store = f"{env['store']}/{APP[stage]}"
    assert app["spec"]["arguments"][:3] == [stage, "--engine", "spark"]
    assert argument(app, "--input") == f"{store}/input"
    assert argument(app, "--output") == f"{store}/output"
    build_parser(stage).parse_args(app["spec"]["arguments"][1:])  # the stage's real flags
    assert ("--seed" in app["spec"]["arguments"]) == (stage == "split")
    assert app["spec"]["image"] == IMAGE and app["spec"]["executor"]["instances"] == 3
    assert storage.list_keys(f"{store}/input") == ["_SUCCESS", "data.bin",
                                                   f"{READS[stage]}_manifest.json"]
    logs = server.cluster.seen("GET", "/log")
    assert {r.path.rsplit("/", 2)[-2] for r in logs} == {f"{APP[stage]}-driver"}
    assert {r.query.get("container") for r in logs} == {"spark-kubernetes-driver"}
    assert server.cluster.seen("DELETE") == []


def test_a_failed_driver_fails_the_step_with_its_last_error_line(env, cli, monkeypatch
                                                                 ) -> None:
    """The driver's stage refuses its input: nothing is published, anywhere, and the step's
    one line ends with the stage's own error line from the driver's log."""
    lines = ["spark: started Spark 4.0.5, master k8s://https://kubernetes",
             "Traceback (most recent call last):", "ValueError: not the last word",
             "vaecf preprocess: error: ratings.csv: line 3: column 'movieId': 'two' is not "
             "an integer", "26/11/26 10:00:01 INFO ShutdownHookManager: Shutdown hook called"]
    with serve(env, monkeypatch, states=["SUBMITTED", "RUNNING", "FAILING", "FAILED"],
               log_lines=lines):
        code, out, err = cli(*argv(env))
    assert code == 1
    assert err == (f"vaecf launch-sparkapp: error: sparkapplication team-a/{APP['preprocess']} "
                   "failed: FAILED: driver container failed with ExitCode: 1, Reason: Error; "
                   "the driver log's last error: vaecf preprocess: error: ratings.csv: line 3: "
                   "column 'movieId': 'two' is not an integer\n")
    assert "ValueError: not the last word" in out
    assert not env["output"].exists()
    assert storage.list_keys(f"{env['store']}/{APP['preprocess']}/output") == []


def test_a_failed_submission_fails_the_step_at_once(env, cli, monkeypatch) -> None:
    """SUBMISSION_FAILED under restartPolicy Never is final: no driver pod, no log."""
    with serve(env, monkeypatch, states=["SUBMISSION_FAILED"]) as server:
        code, _, err = cli(*argv(env))
    assert code == 1
    assert err == (f"vaecf launch-sparkapp: error: sparkapplication team-a/{APP['preprocess']} "
                   "failed: SUBMISSION_FAILED: failed to run spark-submit: exit status 1; see "
                   "the driver log above\n")
    assert server.cluster.seen("GET", "/log") == []
    assert not env["output"].exists()


def test_an_existing_application_is_attached_not_recreated(env, cli, monkeypatch) -> None:
    existing = {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
                "metadata": {"name": APP["preprocess"], "namespace": "team-a",
                             "uid": "first-attempt", "resourceVersion": "1"},
                "spec": {"arguments": ["preprocess", "--output",
                                       f"{env['store']}/{APP['preprocess']}/output"]},
                "status": {"applicationState": {"state": "RUNNING"}}}
    driver_publishes(existing)
    with serve(env, monkeypatch, existing=existing, states=["COMPLETED"]) as server:
        code, out, err = cli(*argv(env))
    assert code == 0, err
    assert f"sparkapplication team-a/{APP['preprocess']} already exists: attaching" in out
    assert len(server.cluster.seen("POST")) == 1  # answered 409
    assert server.cluster.jobs[APP["preprocess"]]["metadata"]["uid"] == "first-attempt"
    assert storage.list_keys(f"{env['store']}/{APP['preprocess']}/input") == []  # not staged
    assert read_manifest(env["output"], "preprocess")["engine"] == "spark"


def test_sigterm_deletes_the_application(env, monkeypatch) -> None:
    with serve(env, monkeypatch, states=["SUBMITTED", "RUNNING"]) as server:
        code, err = sigterm_once_watching(server, argv(env))
    assert code == 1
    assert err == (f"vaecf launch-sparkapp: error: sparkapplication team-a/{APP['preprocess']}: "
                   "cancelled by SIGTERM; deleted the application\n")
    (delete,) = server.cluster.seen("DELETE")
    assert delete.path == ("/apis/sparkoperator.k8s.io/v1beta2/namespaces/team-a/"
                           f"sparkapplications/{APP['preprocess']}")
    assert delete.body == {"propagationPolicy": "Foreground",
                           "preconditions": {"uid": "uid-1"}}
    assert APP["preprocess"] not in server.cluster.jobs
    assert not env["output"].exists()


def test_sigterm_while_the_watch_waits_for_its_answer_deletes_the_application(
        env, monkeypatch) -> None:
    """The watch is accepted and never answered (a stalled connection), its read limit 10
    minutes: the signal cuts the connection, so the step acts at once instead of waiting."""
    with serve(env, monkeypatch, states=["SUBMITTED"], stall={"watch": 1}) as server:
        code, err = sigterm_once_watching(server, argv(env, "--request-timeout", "600"))
    assert code == 1
    assert err == (f"vaecf launch-sparkapp: error: sparkapplication team-a/{APP['preprocess']}: "
                   "cancelled by SIGTERM; deleted the application\n")
    assert len(server.cluster.seen("DELETE")) == 1 and APP["preprocess"] not in server.cluster.jobs


# Run in the launcher's process: SIGTERM arrives in the main thread the moment it has taken a
# lock, before the `with` block that releases it begins (CPython runs signal handlers between
# the two; under load a SIGTERM sent at any time lands there now and then). site "pool": the
# lock of urllib3's connection pool, taken for the watch; "wake": the lock of the log
# follower's Event, taken when a watch event wakes it.
UNLUCKY = """
import queue, signal, sys, threading
import urllib3.connectionpool as pool
from vaecf.cli import main
from vaecf.k8s import pod_log

site = sys.argv[1]


class Unlucky(threading.Condition):
    armed = None  # then True from the first watch until it fires, then False

    def __enter__(self):
        entered = super().__enter__()
        if Unlucky.armed and threading.current_thread() is threading.main_thread():
            Unlucky.armed = False
            signal.raise_signal(signal.SIGTERM)  # its handler runs before this returns
        return entered


class Queue(queue.LifoQueue):
    def __init__(self, maxsize):
        super().__init__(maxsize)
        if site == "pool":
            self.not_empty = Unlucky(self.mutex)


open_request, start_log = pool.HTTPConnectionPool.urlopen, pod_log.PodLog.__init__


def urlopen(self, method, url, *args, **kwargs):
    if "watch=true" in url.lower() and Unlucky.armed is None:
        Unlucky.armed = True
    return open_request(self, method, url, *args, **kwargs)


def follow(self, *args, **kwargs):
    start_log(self, *args, **kwargs)
    if site == "wake":
        self._wake._cond = Unlucky(threading.Lock())


pool.HTTPConnectionPool.QueueCls, pool.HTTPConnectionPool.urlopen = Queue, urlopen
pod_log.PodLog.__init__ = follow
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.timeout(150)  # the guard below, after the launcher's start
@pytest.mark.parametrize("site", ["pool", "wake"])
def test_sigterm_that_lands_while_a_lock_is_held_still_deletes_the_application(
        env, monkeypatch, site) -> None:
    """The handler used to raise at that point, leaving the lock held: the delete that
    followed then waited on it for ever (the launcher never ended). Now the handler only
    records the signal, and the step acts on it between calls."""
    with serve(env, monkeypatch, states=["SUBMITTED", "RUNNING"]) as server:
        process = subprocess.Popen([sys.executable, "-c", UNLUCKY, site, *argv(env)],
                                   env=dict(os.environ), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        try:
            _, err = process.communicate(timeout=120)  # seconds if it works; guards a hang
        except subprocess.TimeoutExpired:
            err = None
        finally:
            process.kill()
    assert err is not None, "the launcher did not end after SIGTERM (a lock left held?)"
    assert process.returncode == 1, err
    assert err == (f"vaecf launch-sparkapp: error: sparkapplication team-a/{APP['preprocess']}: "
                   "cancelled by SIGTERM; deleted the application\n")
    (delete,) = server.cluster.seen("DELETE")
    assert delete.body == {"propagationPolicy": "Foreground",
                           "preconditions": {"uid": "uid-1"}}
    assert APP["preprocess"] not in server.cluster.jobs


def test_watch_errors_and_an_expired_version_are_ridden_out(env, cli, monkeypatch) -> None:
    errors = [{"code": 504, "reason": "Timeout", "message": "Too large resource version",
               "details": {"retryAfterSeconds": 1}},
              {"code": 410, "reason": "Expired", "message": "too old resource version: 2 (5)"}]
    with serve(env, monkeypatch, watch_errors=errors, states=["RUNNING", "COMPLETED"],
               on_create=driver_publishes) as server:
        code, out, err = cli(*argv(env))
    assert code == 0, err
    assert (f"sparkapplication team-a/{APP['preprocess']}: watch: HTTP 504 Timeout: Too large "
            "resource version; watching again in 1 s") in out
    watches = [r for r in server.cluster.seen("GET", "/sparkapplications")
               if r.query.get("watch")]
    gets = server.cluster.seen("GET", f"/sparkapplications/{APP['preprocess']}")
    # one GET before creating (is the input staged?), one to follow; none after the 410
    assert len(watches) == 3 and len(gets) == 2
    assert watches[2].query.get("resourceVersion") is None  # from now
    assert read_manifest(env["output"], "preprocess")["counts"] == {"rows": 3}


def test_an_application_deleted_under_the_step_is_never_created_again(env, cli, monkeypatch
                                                                      ) -> None:
    with serve(env, monkeypatch, states=["RUNNING", "Deleted"]) as server:
        code, _, err = cli(*argv(env))
    marker = f"{env['store']}/{APP['preprocess']}/deleted/sparkapplication.json"
    assert code == 1
    assert err == (f"vaecf launch-sparkapp: error: sparkapplication team-a/{APP['preprocess']} "
                   "was deleted by someone other than this step while it followed the job; not "
                   f"re-creating it: {marker} keeps later attempts of this run from doing so\n")
    assert server.cluster.seen("DELETE") == []
    with serve(env, monkeypatch) as retry:
        code, _, err = cli(*argv(env))
    assert code == 1 and "was deleted by someone else during an earlier attempt" in err
    assert retry.cluster.requests == []


def test_an_application_gone_when_the_step_looks_is_deleted_elsewhere(env, cli, monkeypatch
                                                                      ) -> None:
    """Deleted between its creation and the step's first look (a 404, no DELETED event)."""
    with serve(env, monkeypatch) as server:
        server.cluster.scenario.on_create = lambda app: server.cluster.jobs.pop(
            app["metadata"]["name"])
        code, _, err = cli(*argv(env))
    assert code == 1
    assert err.startswith(f"vaecf launch-sparkapp: error: sparkapplication team-a/"
                          f"{APP['preprocess']} was deleted by someone other than this step")
    gets = server.cluster.seen("GET", f"/sparkapplications/{APP['preprocess']}")
    assert len(gets) == 2  # is the input staged? then: where is it? (404)
    assert storage.list_keys(f"{env['store']}/{APP['preprocess']}/deleted") == [
        "sparkapplication.json"]


def test_the_driver_log_is_followed_again_when_its_stream_ends(env, cli, monkeypatch) -> None:
    lines = [f"step {i}" for i in range(1, 9)]
    with serve(env, monkeypatch, states=["RUNNING", "COMPLETED"], log_lines=lines,
               log_drops=[3, 5], on_create=driver_publishes) as server:
        code, out, err = cli(*argv(env))
    assert code == 0, err
    assert [line for line in out.splitlines() if line.startswith("step ")] == lines
    logs = server.cluster.seen("GET", "/log")
    assert len(logs) >= 3 and "sinceSeconds" in logs[1].query


@pytest.mark.parametrize(("extra", "message"), [
    (["--executors", "0"], "--executors 0: expected 1..1000"),
    (["--executor-memory", "4GB"], "--executor-memory '4GB': expected a size such as 512m"),
    (["--image", "Not An Image"], "--image 'Not An Image': expected registry/name"),
    (["--store", "/tmp/x"], "--store '/tmp/x': expected an s3:// prefix"),
    (["--protocol", "loose"], "argument --protocol: invalid choice: 'loose'"),
    (["--stage", "train"], "argument --stage: invalid choice: 'train'"),
])
def test_bad_input_creates_nothing(env, cli, monkeypatch, extra, message) -> None:
    with serve(env, monkeypatch) as server:
        code, _, err = cli(*argv(env, *extra))
    assert code == 1
    assert message in err and err.count("\n") == 1
    assert server.cluster.requests == []


def test_an_input_without_its_manifest_creates_nothing(env, cli, monkeypatch) -> None:
    with serve(env, monkeypatch) as server:
        given = argv(env, stage="split")
        (env["split"] / "preprocess_manifest.json").unlink()
        code, _, err = cli(*given)
    assert code == 1 and "preprocess_manifest.json: manifest missing" in err
    assert server.cluster.requests == []


def rbac_verb(request: Any) -> tuple[str, str, str]:
    """(API group, resource, verb) of a request, as the API server's authorizer sees it."""
    parts = request.path.strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[parts.index("namespaces") + 2:]
    resource = "/".join([rest[0], *rest[2:]])
    verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch"}.get(request.method)
    if verb is None:
        verb = "get" if len(rest) > 1 else ("watch" if request.query.get("watch") else "list")
    return group, resource, verb


def granted(path: Path, role: str) -> set[tuple[str, str, str]]:
    (found,) = [d for d in yaml.safe_load_all(path.read_text())
                if d["kind"] == "Role" and d["metadata"]["name"] == role]
    return {(group, resource, verb) for rule in found["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def test_the_launcher_roles_grant_what_the_step_calls(env, cli, monkeypatch) -> None:
    """Every request of a failed application replaced, a run with a log and a timeout with
    diagnostics is granted by the launcher's Roles (manifests/base and manifests/spark), and
    the Spark Role grants nothing the step does not use."""
    failed = {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
              "metadata": {"name": APP["preprocess"], "namespace": "team-a",
                           "uid": "first-attempt", "resourceVersion": "1"}, "spec": {},
              "status": {"applicationState": {"state": "FAILED"}}}
    used: set[tuple[str, str, str]] = set()
    codes = []
    for scenario, extra in [
            ({"existing": failed, "log_lines": ["step 1"], "on_create": driver_publishes,
              "deletion_seconds": 0.5, "states": ["RUNNING", "COMPLETED"]}, ()),
            ({"states": ["RUNNING"]}, ("--timeout", "1"))]:
        with serve(env, monkeypatch, **scenario) as server:
            code, out, err = cli(*argv(env, *extra))
        codes.append(code)
        used |= {rbac_verb(r) for r in server.cluster.requests}
        if scenario.get("existing"):  # the failed one was deleted and created again
            assert (f"sparkapplication team-a/{APP['preprocess']} exists and failed (FAILED): "
                    "deleting it to run it again") in out
            assert server.cluster.jobs[APP["preprocess"]]["metadata"]["uid"] == "uid-1"
        else:
            assert err.endswith("did not finish within 1 s; deleted the application\n")
    assert codes == [0, 1]
    spark = granted(ROOT / "manifests" / "spark" / "rbac.yaml", "vaecf-spark-launcher")
    launcher = granted(ROOT / "manifests" / "base" / "rbac.yaml", "vaecf-launcher")
    assert used <= spark | launcher
    assert spark == {u for u in used if u[0] == "sparkoperator.k8s.io"}
    assert {("", "pods", "list"), ("", "pods/log", "get"), ("", "events", "list")} <= used


def test_the_application_sent_validates_against_the_crd(env, cli, monkeypatch) -> None:
    import jsonschema

    with serve(env, monkeypatch, on_create=driver_publishes,
               states=["COMPLETED"]) as server:
        code, _, err = cli(*argv(env, "--driver-memory", "2g", "--secret-name", "minio"))
    assert code == 0, err
    (post,) = server.cluster.seen("POST")
    jsonschema.validate(post.body, crd_schema("sparkapplication-crd-v1beta2.yaml"))
    spec = post.body["spec"]
    assert spec["driver"]["memory"] == "2g"
    env_refs = {e["valueFrom"]["secretKeyRef"]["name"] for role in ("driver", "executor")
                for e in sparkapp.container(spec, role)["env"] if "valueFrom" in e}
    assert env_refs == {"minio"}
    assert sparkapp.pod_spec(spec, "driver")["activeDeadlineSeconds"] == 86400
    assert json.dumps(spec).count(f'"subPath": "{APP["preprocess"]}"') == 1  # the driver's


@pytest.mark.parametrize(("role", "where", "key"), [
    ("executor", [], "automountServiceAcountToken"),
    ("driver", ["containers", 0, "securityContext"], "runAsNonRot")])
def test_a_pod_template_field_the_operator_would_drop_is_refused(env, cli, monkeypatch, role,
                                                                 where, key) -> None:
    """The CRD keeps pod templates unvalidated and the operator drops unknown keys: a typo
    would silently leave the pods with an API token, or running as root. Refused in one
    line naming it, before anything is created."""
    template = sparkapp.load_template(sparkapp.default_template())
    found = sparkapp.pod_spec(template["spec"], role)
    for step in where:
        found = found[step]
    found[key] = True
    path = env["tmp"] / "sparkapplication.yaml"
    path.write_text(json.dumps(template))
    with serve(env, monkeypatch) as server:
        code, _, err = cli(*argv(env, "--template", str(path)))
    named = ".".join(str(step) for step in where).replace(".0", "[0]")
    field = f"spec.{role}.template.spec.{named + '.' if named else ''}{key}"
    assert code == 1 and err.count("\n") == 1
    assert err.startswith(f"vaecf launch-sparkapp: error: {path}: {field}: not a field of a pod "
                          "template (the Kubernetes API of the kubernetes client ")
    assert server.cluster.requests == []
