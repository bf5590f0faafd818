"""``vaecf launch-mpijob`` against a fake Kubernetes API server on loopback (real HTTP, the
real ``kubernetes`` client) and a real S3 server (moto) holding the split and the model."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import FakeApiServer, Scenario, sigterm_once_watching

from vaecf.io import publish, read_manifest, storage, write_manifest
from vaecf.k8s import inferenceservice, render

RUN_ID = "2f0c1a9e-6a4b-4b3e-9d8e-0123456789ab"
JOB = "vaecf-train-2f0c1a9e-6a4b-4b3e-9d8e-0123456789ab"
IMAGE = "ghcr.io/vaecf/vaecf-train:0.1.0"


def make_split(root: Path) -> Path:
    """The smallest directory ``launch-mpijob`` accepts as a split: files + their manifest."""
    split = root / "split"
    split.mkdir()
    (split / "train.npz").write_bytes(b"not read by the launcher")
    write_manifest(split, "dataset", inputs={}, parameters={}, counts={"n_items": 3},
                   started=time.monotonic())
    return split


def publish_model(uri: str) -> None:
    """What ``vaecf train`` leaves in object storage when it succeeds."""
    with publish(uri, "train_manifest.json") as staging:
        (staging / "saved_model").mkdir()
        (staging / "saved_model" / "saved_model.pb").write_bytes(b"graph")
        (staging / "train_log.jsonl").write_text('{"epoch": 1}\n')
        write_manifest(staging, "train", inputs={}, parameters={}, counts={},
                       started=time.monotonic(), extra={"n_items": 3, "best_epoch": 1})


def train_output(job: dict[str, Any]) -> str:
    args = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0][
        "args"]
    return str(args[args.index("--output") + 1])


@pytest.fixture()
def env(tmp_path: Path, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return {"tmp": tmp_path, "bucket": s3_bucket, "split": make_split(tmp_path),
            "output": tmp_path / "model"}


def argv(env: dict[str, Any], *extra: str) -> list[str]:
    return ["launch-mpijob", "--split", str(env["split"]), "--output", str(env["output"]),
            "--store", f"s3://{env['bucket']}/runs", "--run-id", RUN_ID, "--image", IMAGE,
            "--namespace", "team-a", "--workers", "2", "--gpus-per-worker", "1",
            "--epochs", "3", "--batch-per-rank", "32", *extra]


def serve(env: dict[str, Any], monkeypatch: pytest.MonkeyPatch, scenario: Scenario
          ) -> FakeApiServer:
    server = FakeApiServer(scenario)
    monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(env["tmp"] / "kubeconfig")))
    return server


def test_succeeded_streams_the_log_and_publishes_the_model(env, cli, monkeypatch) -> None:
    scenario = Scenario(states=["Created", "Running", "Succeeded"],
                        log_lines=["epoch 1 loss 812.5", "epoch 3 ndcg_at_100 0.41"],
                        on_create=lambda job: publish_model(train_output(job)))
    with serve(env, monkeypatch, scenario) as server:
        code, out, err = cli(*argv(env))
    assert code == 0, err
    assert "epoch 1 loss 812.5\nepoch 3 ndcg_at_100 0.41\n" in out
    assert read_manifest(env["output"], "train")["best_epoch"] == 1
    assert (env["output"] / "saved_model" / "saved_model.pb").read_bytes() == b"graph"
    (post,) = server.cluster.seen("POST", "/namespaces/team-a/mpijobs")
    assert post.body is not None and post.body["metadata"]["name"] == JOB
    store = f"s3://{env['bucket']}/runs/{JOB}"
    assert train_output(post.body) == f"{store}/model"
    launcher = post.body["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"][
        "containers"][0]
    args = launcher["args"]
    # 2 ranks x 32 users; the default rule scales train's 5e-4 at 500 users by sqrt(64 / 500)
    assert args[args.index("--batch-size") + 1] == "64"
    assert args[args.index("--learning-rate") + 1] == "0.000178885"
    assert "--compression" not in args  # none: the trainer's default
    assert {"name": "NCCL_DEBUG", "value": "WARN"} in launcher["env"]
    assert storage.list_keys(f"{store}/split") == ["_SUCCESS", "dataset_manifest.json",
                                                   "train.npz"]
    assert server.cluster.seen("DELETE") == []


def test_failed_job_fails_the_step_and_writes_nothing(env, cli, monkeypatch) -> None:
    scenario = Scenario(states=["Running", "Failed"], log_lines=["Traceback: boom"])
    with serve(env, monkeypatch, scenario):
        code, out, err = cli(*argv(env))
    assert code == 1
    assert err == (f"vaecf launch-mpijob: error: mpijob team-a/{JOB} failed: MPIJobFailed: "
                   "launcher exited with code 1; see the launcher log above\n")
    assert "Traceback: boom" in out
    assert not env["output"].exists()


def test_existing_job_is_attached_not_recreated(env, cli, monkeypatch) -> None:
    existing = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
                "metadata": {"name": JOB, "namespace": "team-a", "uid": "first-attempt",
                             "resourceVersion": "1"}, "spec": {}}
    publish_model(f"s3://{env['bucket']}/runs/{JOB}/model")
    with serve(env, monkeypatch, Scenario(existing=existing)) as server:
        code, out, err = cli(*argv(env))
    assert code == 0, err
    assert f"mpijob team-a/{JOB} already exists: attaching to it" in out
    assert len(server.cluster.seen("POST")) == 1  # answered 409
    assert server.cluster.jobs[JOB]["metadata"]["uid"] == "first-attempt"
    assert storage.list_keys(f"s3://{env['bucket']}/runs/{JOB}/split") == []
    assert read_manifest(env["output"], "train")["n_items"] == 3


def event(kind: str, name: str, kind_of_event: str, reason: str, message: str
          ) -> dict[str, Any]:
    return {"metadata": {"name": f"{name}.1", "namespace": "team-a"}, "type": kind_of_event,
            "involvedObject": {"kind": kind, "name": name, "namespace": "team-a"},
            "reason": reason, "message": message}


def test_timeout_deletes_the_job_and_says_why_it_was_stuck(env, cli, monkeypatch) -> None:
    events = [event("Pod", f"{JOB}-worker-1", "Warning", "FailedScheduling",
                    "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."),
              event("Pod", f"{JOB}-worker-0", "Normal", "Scheduled", "assigned"),
              event("Pod", "someone-elses-pod", "Warning", "BackOff", "not ours")]
    scenario = Scenario(states=["Running"], events=events)
    with serve(env, monkeypatch, scenario) as server:
        code, out, err = cli(*argv(env, "--timeout", "1"))
    assert code == 1
    assert (f"event Pod/{JOB}-worker-1: FailedScheduling: 0/3 nodes are available: "
            "3 Insufficient nvidia.com/gpu.") in out
    assert "Scheduled" not in out and "not ours" not in out
    # a loaded host may see the last watch read time out at the deadline first
    assert re.fullmatch(f"vaecf launch-mpijob: error: mpijob team-a/{JOB}: did not finish "
                        r"within 1 s( \(last trouble: .+\))?; deleted the job\n", err), err
    (delete,) = server.cluster.seen("DELETE")
    assert delete.path == f"/apis/kubeflow.org/v2beta1/namespaces/team-a/mpijobs/{JOB}"
    assert not env["output"].exists()


def test_sigterm_deletes_the_job(env, monkeypatch) -> None:
    with serve(env, monkeypatch, Scenario(states=["Running"])) as server:
        code, err = sigterm_once_watching(server, argv(env))
    assert code == 1
    assert err.strip().endswith(f"mpijob team-a/{JOB}: cancelled by SIGTERM; deleted the job")
    assert [r.path.rsplit("/", 1)[-1] for r in server.cluster.seen("DELETE")] == [JOB]
    assert JOB not in server.cluster.jobs


@pytest.mark.parametrize(("extra", "message"), [
    (["--workers", "0"], "--workers 0: expected 1..1024"),
    (["--batch-per-rank", "0"], "--batch-per-rank 0: expected 1.."),
    (["--lr-scaling", "cubic"], "--lr-scaling 'cubic': expected one of none, sqrt, linear"),
    (["--compression", "fp8"], "--compression 'fp8': expected one of none, fp16"),
    (["--nccl-debug", "LOUD"], "--nccl-debug 'LOUD': expected one of VERSION, WARN, INFO"),
    (["--store", "s3://ab"], "s3://ab/vaecf-train-"),
    (["--image", "Not An Image"], "--image 'Not An Image': expected registry/name"),
    (["--slots-per-worker", "2"], "--slots-per-worker 2: must equal --gpus-per-worker 1"),
    (["--timeout", "-1"], "argument --timeout: expected a finite number > 0, got -1 (see "),
    (["--timeout", "nan"], "argument --timeout: expected a finite number > 0, got nan (see "),
])
def test_bad_input_creates_nothing(env, cli, monkeypatch, extra, message) -> None:
    with serve(env, monkeypatch, Scenario()) as server:
        code, _, err = cli(*argv(env, *extra))
    assert code == 1
    assert message in err and err.count("\n") == 1
    assert server.cluster.requests == []


def test_a_template_that_is_not_an_mpijob_creates_nothing(env, cli, monkeypatch) -> None:
    service = inferenceservice.default_template()
    missing = env["tmp"] / "no-such.yaml"
    with serve(env, monkeypatch, Scenario()) as server:
        other = cli(*argv(env, "--template", str(service)))
        absent = cli(*argv(env, "--template", str(missing)))
    assert other == (1, "", f"vaecf launch-mpijob: error: {service}: not an MPIJob manifest\n")
    assert absent[0] == 1 and absent[2].count("\n") == 1
    assert absent[2] == f"vaecf launch-mpijob: error: {missing}: input file does not exist\n"
    assert server.cluster.requests == []


def test_split_without_manifest_creates_nothing(env, cli, monkeypatch) -> None:
    (env["split"] / "dataset_manifest.json").unlink()
    with serve(env, monkeypatch, Scenario()) as server:
        code, _, err = cli(*argv(env))
    assert code == 1 and "dataset_manifest.json: manifest missing" in err
    assert server.cluster.requests == []


def test_job_name_is_a_stable_dns1035_label() -> None:
    assert render.job_name(RUN_ID) == JOB  # a KFP run id (a UUID) is kept as it is
    assert render.job_name("Run_42/Retry") == "vaecf-train-run-42-retry-" + hashlib.sha256(
        b"Run_42/Retry").hexdigest()[:8]
    long = render.job_name("x" * 100)
    assert len(long) == render.MAX_JOB_NAME == 51 and long == render.job_name("x" * 100)
    assert long != render.job_name("x" * 101)


def test_names_from_any_run_id_are_valid_for_mpi_operator_and_unique() -> None:
    """mpi-operator refuses a job whose <name>-worker-<N-1> or <name>-launcher is not a
    DNS label of <= 63 (with only a Warning event: the step would wait out its timeout)."""
    ids = [RUN_ID, "run-42", "Run_42", "run_42", "RUN-42", "x" * 39, "x" * 40, "x" * 300,
           "y" * 40 + "1", "y" * 40 + "2", "ü-run", *(f"sweep-{i}-" + "t" * 60 for i in range(50))]
    names = {render.job_name(run_id) for run_id in ids}
    assert len(names) == len(ids)  # different run ids never share a job
    for name in names:
        for pod in (f"{name}-launcher", f"{name}-worker-{render.MAX_WORKERS - 1}"):
            assert len(pod) <= 63 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", pod), pod
    assert render.job_name("x" * 39) == "vaecf-train-" + "x" * 39  # the longest kept whole


def test_a_name_too_long_for_the_workers_pod_names_is_refused() -> None:
    from vaecf.errors import VaecfError

    params = render.MPIJobParams(
        name="v" * 55, namespace="team-a", run_id="r", image=IMAGE, split_uri="s3://bkt/s",
        model_uri="s3://bkt/m", checkpoint_uri="s3://bkt/c", workers=16)
    with pytest.raises(VaecfError, match=r"its pod 'v{55}-worker-15' would not be a DNS-1035"):
        render.validate(params)


def launcher_command(job: dict[str, Any]) -> list[str]:
    args = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0][
        "args"]
    return [str(a) for a in args[args.index("vaecf"):]]


def test_trial_hyperparameters_and_tensorboard_reach_vaecf_train(env, cli, monkeypatch) -> None:
    """A sweep trial: its hyperparameters become train flags (epochs replaces --epochs), and
    rank 0 writes TensorBoard events under the job's prefix."""
    scenario = Scenario(states=["Running", "Succeeded"],
                        on_create=lambda job: publish_model(train_output(job)))
    trial = '{"beta_cap": 0.4, "anneal_steps": null, "learning_rate": 0.003, "epochs": 7}'
    with serve(env, monkeypatch, scenario) as server:
        code, _, err = cli(*argv(env, "--hyperparameters", trial))
    assert code == 0, err
    (post,) = server.cluster.seen("POST", "/namespaces/team-a/mpijobs")
    command = launcher_command(post.body)
    assert command[command.index("--epochs") + 1] == "7" and command.count("--epochs") == 1
    assert command[command.index("--beta-cap") + 1] == "0.4"
    assert command[command.index("--learning-rate") + 1] == "0.003"
    assert "--anneal-steps" not in command  # null: train's default schedule
    assert command[command.index("--tensorboard-dir") + 1] == (
        f"s3://{env['bucket']}/runs/{JOB}/tensorboard")
    from vaecf.stages.train import build_parser

    build_parser().parse_args(command[2:])  # every flag is one vaecf train accepts


@pytest.mark.parametrize(("trial", "message"), [
    ('{"beta_cap": -1}', "--hyperparameters: beta_cap -1: expected a number >= 0"),
    ('{"momentum": 0.9}', "--hyperparameters: unknown hyperparameter 'momentum'"),
    ('{"hidden": 1.5}', "--hyperparameters: hidden 1.5: expected an integer >= 1"),
    ("[1]", "--hyperparameters: expected a JSON object of hyperparameters")])
def test_bad_trial_hyperparameters_fail_before_any_job(env, cli, monkeypatch, trial: str,  # type: ignore[no-untyped-def]
                                                       message: str) -> None:
    with serve(env, monkeypatch, Scenario()) as server:
        code, _, err = cli(*argv(env, "--hyperparameters", trial))
    assert code == 1 and message in err
    assert server.cluster.seen("POST") == []


# What a real cluster does beyond the happy path. Tests that could hang a launcher without
# client-side timeouts run it as a process, with a bound.

def launched(env: dict[str, Any], *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "vaecf.cli", *argv(env, *extra)],
                            env=dict(os.environ), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen[str], seconds: float = 90) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=seconds)
    finally:
        process.kill()
    return process.returncode, out, err


def test_a_stalled_watch_cannot_hold_the_step_past_its_timeout(env, monkeypatch) -> None:
    """A partition: the watch is accepted and never answered. The deadline still holds."""
    scenario = Scenario(states=["Running"], stall={"watch": 100})
    with serve(env, monkeypatch, scenario) as server:
        started = time.monotonic()
        code, _, err = finish(launched(env, "--timeout", "3", "--request-timeout", "1"))
        took = time.monotonic() - started
    assert code == 1
    assert err == (f"vaecf launch-mpijob: error: mpijob team-a/{JOB}: did not finish within 3 s"
                   " (last trouble: watch failed: no answer (ReadTimeoutError: Read timed out.)); "
                   "deleted the job\n")
    assert [r.path.rsplit("/", 1)[-1] for r in server.cluster.seen("DELETE")] == [JOB]
    assert took < 30, took


def test_sigterm_during_a_partition_still_deletes_the_job(env, monkeypatch) -> None:
    """The first DELETE hangs (with the default 30 s request timeout, longer than the
    grace); the next, once the partition heals, deletes the job within the pod's 30 s
    termination grace."""
    scenario = Scenario(states=["Running"], stall={"DELETE": 1})
    with serve(env, monkeypatch, scenario) as server:
        process = launched(env)
        assert server.cluster.watching.wait(timeout=120), "the launcher never watched"
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code, out, err = finish(process, 60)
        took = time.monotonic() - started
    assert code == 1
    assert err == (f"vaecf launch-mpijob: error: mpijob team-a/{JOB}: cancelled by SIGTERM; "
                   "deleted the job\n")
    assert f"mpijob team-a/{JOB}: delete: no answer (ReadTimeoutError" in out
    assert len(server.cluster.seen("DELETE")) == 2 and JOB not in server.cluster.jobs
    assert took < 30, took  # the pod's grace; the step's own bound is 20 s


@pytest.mark.slow  # its own `took < 60` is the check, not the 60 s guard
def test_a_server_that_never_answers_cannot_hold_the_step_past_its_timeout(env, monkeypatch
                                                                          ) -> None:
    """Every request is accepted and never answered, from the first (default 30 s request
    timeout): the step ends at its deadline, and knows it created nothing."""
    with serve(env, monkeypatch, Scenario(frozen=True)) as server:
        started = time.monotonic()
        code, _, err = finish(launched(env, "--timeout", "3"), 120)
        took = time.monotonic() - started
    assert code == 1
    assert err == (f"vaecf launch-mpijob: error: mpijob team-a/{JOB}: did not finish within 3 s"
                   " (last trouble: get failed: no answer (ReadTimeoutError: Read timed out.)); "
                   "nothing was created\n")
    assert [r.method for r in server.cluster.requests] == ["GET"]
    assert took < 60, took  # 3 s, and the process's start; it was 300 s


@pytest.mark.slow  # its own `took < 60` is the check, not the 60 s guard
def test_a_connection_frozen_after_the_create_cannot_hold_the_step(env, monkeypatch) -> None:
    """The job is created, then every request hangs (default 30 s request timeout): the
    step ends within --timeout + job.CLEANUP_SECONDS (20 s for the diagnostics and the
    delete), saying what it could not do."""
    with serve(env, monkeypatch, Scenario(states=["Running"])) as server:
        server.cluster.scenario.on_create = lambda job: server.cluster.freeze()
        started = time.monotonic()
        code, out, err = finish(launched(env, "--timeout", "3"), 120)
        took = time.monotonic() - started
    assert code == 1
    assert err.startswith(f"vaecf launch-mpijob: error: mpijob team-a/{JOB}: did not finish "
                          "within 3 s (last trouble: get failed: no answer (ReadTimeoutError: "
                          "Read timed out.)); could not delete the job (")
    assert err.endswith(f"or run: kubectl delete mpijob -n team-a {JOB}\n")
    assert "(events unavailable: " in out
    assert len(server.cluster.seen("DELETE")) >= 2  # short requests, retried
    assert took < 60, took  # 3 + 20 s, and the process's start; it was 133 s at --timeout 45


def test_a_403_burst_after_a_restart_is_ridden_out_and_deletes_nothing(env, cli,
                                                                       monkeypatch) -> None:
    """The API server restarts under a running job and refuses the watch it granted before
    (RBAC caches not synced yet): the step retries, follows the job to its end, deletes
    nothing."""
    scenario = Scenario(states=["Running", "Succeeded"], restart_at_state="Running",
                        down_seconds=0.2, forbidden_after_restart={"watch": 1, "GET": 2},
                        state_seconds=1.5, on_create=lambda job: publish_model(train_output(job)))
    with serve(env, monkeypatch, scenario) as server:
        code, out, err = cli(*argv(env))
    assert code == 0, err
    assert server.restarts == 1
    assert (f"mpijob team-a/{JOB}: watch failed: HTTP 403 Forbidden: mpijobs.kubeflow.org is "
            "forbidden") in out
    assert server.cluster.seen("DELETE") == []
    assert read_manifest(env["output"], "train")["n_items"] == 3


def test_a_watch_from_an_expired_version_backs_off_and_resumes_from_now(env, cli,
                                                                         monkeypatch) -> None:
    """After a restart the watch cache starts at etcd's revision: a watch from the job's
    resourceVersion gets 410 however often the job is read again (it has not changed). The
    step pauses and watches from now: a handful of requests, not a loop of them."""
    scenario = Scenario(states=["Running", "Succeeded"], restart_at_state="Running",
                        down_seconds=0.2, expire_on_restart=True, state_seconds=1.5,
                        on_create=lambda job: publish_model(train_output(job)))
    with serve(env, monkeypatch, scenario) as server:
        code, out, err = cli(*argv(env))
    assert code == 0, err
    assert server.restarts == 1
    assert "too old resource version" in out and "(watching from now)" in out
    watches = [r for r in server.cluster.seen("GET", "/mpijobs") if r.query.get("watch")]
    gets = server.cluster.seen("GET", f"/mpijobs/{JOB}")
    assert len(watches) <= 4 and len(gets) == 2, (len(watches), len(gets))
    assert watches[-1].query.get("resourceVersion") is None
    assert len(server.cluster.requests) <= 25, len(server.cluster.requests)


def test_a_log_whose_container_ended_is_not_asked_for_again(env, cli, monkeypatch) -> None:
    """The launcher container has ended but a sidecar keeps its pod running: its log is
    complete, so it is read once, not again every second while the job lasts."""
    scenario = Scenario(sidecar=True, main_ended=True, log_lines=["epoch 1 loss 812.5"],
                        states=["Running", "Succeeded"], state_seconds=1.5,
                        on_create=lambda job: publish_model(train_output(job)))
    with serve(env, monkeypatch, scenario) as server:
        code, out, err = cli(*argv(env))
    assert code == 0, err
    assert out.count("epoch 1 loss 812.5\n") == 1
    assert len(server.cluster.seen("GET", "/log")) == 1


def test_a_retry_of_a_failed_run_replaces_the_failed_job(env, cli, monkeypatch) -> None:
    """A KFP retry after the job failed: the failed job's events are logged, it is deleted
    (waiting for its pods to go) and the job is created again, which trains and succeeds."""
    failed = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
              "metadata": {"name": JOB, "namespace": "team-a", "uid": "first-attempt",
                           "resourceVersion": "1"}, "spec": {},
              "status": {"conditions": [{"type": "Failed", "status": "True",
                                         "reason": "MPIJobFailed",
                                         "message": "launcher exited with code 1"}]}}
    events = [dict(event("Pod", f"{JOB}-launcher-x7k2p", "Warning", "BackOff",
                         "Back-off restarting failed container launcher"),
                   lastTimestamp="2026-11-20T10:00:00Z")]
    scenario = Scenario(existing=failed, deletion_seconds=1.5, events=events,
                        on_create=lambda job: publish_model(train_output(job)))
    with serve(env, monkeypatch, scenario) as server:
        code, out, err = cli(*argv(env))
    assert code == 0, err
    assert (f"mpijob team-a/{JOB} exists and failed (MPIJobFailed: launcher exited with code "
            "1): deleting it to train again (from its newest checkpoint)") in out
    assert (f"event Pod/{JOB}-launcher-x7k2p: BackOff: Back-off restarting failed container "
            "launcher") in out
    (delete,) = server.cluster.seen("DELETE")
    assert delete.body == {"propagationPolicy": "Foreground",
                           "preconditions": {"uid": "first-attempt"}}
    assert len(server.cluster.seen("POST")) == 2  # 409 while it existed, then created
    assert server.cluster.jobs[JOB]["metadata"]["uid"] == "uid-1"
    assert read_manifest(env["output"], "train")["n_items"] == 3


def test_a_rerun_waits_for_a_job_being_deleted_and_creates_it_again(env, cli,
                                                                     monkeypatch) -> None:
    """Right after a cancel the job is still in foreground deletion: never attach to it."""
    dying = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
             "metadata": {"name": JOB, "namespace": "team-a", "uid": "cancelled",
                          "resourceVersion": "1", "deletionTimestamp": "2026-11-20T10:00:00Z"},
             "spec": {}, "status": {"conditions": [{"type": "Running", "status": "True"}]}}
    scenario = Scenario(existing=dying, deletion_seconds=1.5,
                        on_create=lambda job: publish_model(train_output(job)))
    with serve(env, monkeypatch, scenario) as server:
        code, out, err = cli(*argv(env))
    assert code == 0, err
    assert (f"mpijob team-a/{JOB} is being deleted (since 2026-11-20T10:00:00Z): waiting until"
            " it is gone to create it again") in out
    assert "attaching" not in out
    assert server.cluster.jobs[JOB]["metadata"]["uid"] == "uid-1"
    assert server.cluster.seen("DELETE") == []


def test_an_api_server_restart_is_ridden_out(env, cli, monkeypatch) -> None:
    """The API server goes away under the watch (connections refused), then comes back."""
    scenario = Scenario(restart_at_watch=1, down_seconds=1.5,
                        on_create=lambda job: publish_model(train_output(job)))
    with serve(env, monkeypatch, scenario) as server:
        code, out, err = cli(*argv(env, "--request-timeout", "2"))
    assert code == 0, err
    assert server.restarts == 1
    assert "Connection refused" in out and "watching again in" in out
    assert read_manifest(env["output"], "train")["n_items"] == 3


def test_watch_errors_are_retried_as_the_server_asks(env, cli, monkeypatch) -> None:
    """A watch ERROR event: 504 with retryAfterSeconds is retried after that long; 410 (the
    resourceVersion sent is too old) makes the step watch from now, after a pause."""
    errors = [{"code": 504, "reason": "Timeout", "message": "Too large resource version: 9, "
               "current: 2", "details": {"retryAfterSeconds": 1}},
              {"code": 410, "reason": "Expired", "message": "too old resource version: 2 (5)"}]
    scenario = Scenario(watch_errors=errors,
                        on_create=lambda job: publish_model(train_output(job)))
    with serve(env, monkeypatch, scenario) as server:
        code, out, err = cli(*argv(env))
    assert code == 0, err
    assert (f"mpijob team-a/{JOB}: watch: HTTP 504 Timeout: Too large resource version: 9, "
            "current: 2; watching again in 1 s") in out
    watches = [r for r in server.cluster.seen("GET", "/mpijobs") if r.query.get("watch")]
    gets = server.cluster.seen("GET", f"/mpijobs/{JOB}")
    # one GET before creating (is the split staged?), one to follow; none after the 410
    assert len(watches) == 3 and len(gets) == 2
    assert [w.query.get("resourceVersion") for w in watches] == ["2", "2", None]  # from now
    assert (f"mpijob team-a/{JOB}: watch: HTTP 410 Expired: too old resource version: 2 (5) "
            "(watching from now); watching again in 2 s") in out
    assert all(w.query["fieldSelector"] == f"metadata.name={JOB}" for w in watches)


def test_a_watch_refused_for_good_deletes_the_job_it_gave_up_on(env, cli, monkeypatch) -> None:
    errors = [{"code": 403, "reason": "Forbidden", "message": 'mpijobs.kubeflow.org is '
               'forbidden: User "system:serviceaccount:team-a:x" cannot watch resource'}]
    with serve(env, monkeypatch, Scenario(watch_errors=errors)) as server:
        code, _, err = cli(*argv(env))
    assert code == 1
    assert err == (f"vaecf launch-mpijob: error: mpijob team-a/{JOB}: watch: HTTP 403 Forbidden:"
                   ' mpijobs.kubeflow.org is forbidden: User "system:serviceaccount:team-a:x" '
                   "cannot watch resource; deleted the job\n")
    assert JOB not in server.cluster.jobs


def test_the_log_is_followed_again_when_its_stream_ends_while_the_pod_runs(env, cli,
                                                                          monkeypatch) -> None:
    """The stream ends after line 3 while the launcher runs on (a dropped stream, or an
    in-place restart): the rest is shown, nothing twice (lines 3 and 4 share a timestamp)."""
    lines = [f"epoch {i} loss {900 - i}" for i in range(1, 9)]
    scenario = Scenario(log_lines=lines, log_drops=[3, 5],
                        on_create=lambda job: publish_model(train_output(job)))
    with serve(env, monkeypatch, scenario) as server:
        code, out, err = cli(*argv(env))
    assert code == 0, err
    shown = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert shown == lines
    logs = server.cluster.seen("GET", "/log")
    assert len(logs) >= 3 and "sinceSeconds" in logs[1].query


def test_the_log_request_names_the_launcher_container(env, cli, monkeypatch) -> None:
    """An injected sidecar: the pod's log needs a container name (HTTP 400 without)."""
    scenario = Scenario(sidecar=True, log_lines=["epoch 1 loss 812.5"],
                        on_create=lambda job: publish_model(train_output(job)))
    with serve(env, monkeypatch, scenario) as server:
        code, out, err = cli(*argv(env))
    assert code == 0, err
    assert "epoch 1 loss 812.5\n" in out
    assert {r.query.get("container") for r in server.cluster.seen("GET", "/log")} == {
        "launcher"}


def test_a_job_deleted_under_the_step_is_never_created_again(env, cli, monkeypatch) -> None:
    """An operator deletes the job mid-run: the step says so at once, and no retry of the
    run re-creates it."""
    with serve(env, monkeypatch, Scenario(states=["Running", "Deleted"])) as server:
        code, _, err = cli(*argv(env))
    marker = f"s3://{env['bucket']}/runs/{JOB}/deleted/mpijob.json"
    assert code == 1
    assert err == (f"vaecf launch-mpijob: error: mpijob team-a/{JOB} was deleted by someone "
                   f"other than this step while it followed the job; not re-creating it: "
                   f"{marker} keeps later attempts of this run from doing so\n")
    assert server.cluster.seen("DELETE") == []
    with serve(env, monkeypatch, Scenario()) as retry:
        code, _, err = cli(*argv(env))
    assert code == 1
    assert err == (f"vaecf launch-mpijob: error: mpijob team-a/{JOB} was deleted by someone "
                   f"else during an earlier attempt of run '{RUN_ID}' "
                   f"(s3://{env['bucket']}/runs/{JOB}/deleted/): not creating it again; start "
                   "a new run (or remove that marker)\n")
    assert retry.cluster.requests == []


def test_diagnostics_show_only_this_jobs_warnings_oldest_first(env, cli, monkeypatch) -> None:
    """Events of a job whose name merely starts with ours (run-4 and run-40) are not ours."""
    other = f"{JOB}0"
    events = [dict(event("Pod", f"{JOB}-worker-1", "Warning", "FailedScheduling",
                         "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."),
                   lastTimestamp="2026-11-20T10:05:00Z"),
              dict(event("Pod", f"{other}-worker-1", "Warning", "FailedScheduling",
                         "another job's"), lastTimestamp="2026-11-20T10:06:00Z"),
              dict(event("MPIJob", JOB, "Warning", "ValidationError", "first"),
                   lastTimestamp="2026-11-20T10:01:00Z"),
              dict(event("Job", f"{JOB}-launcher", "Warning", "BackoffLimitExceeded",
                         "Job has reached the specified backoff limit"),
                   lastTimestamp="2026-11-20T10:03:00Z")]
    events[2]["involvedObject"]["uid"] = "uid-1"  # the job this step creates
    with serve(env, monkeypatch, Scenario(states=["Running", "Failed"], events=events)):
        code, out, _ = cli(*argv(env))
    assert code == 1
    shown = [line for line in out.splitlines() if line.startswith("event ")]
    assert shown == [
        f"event MPIJob/{JOB}: ValidationError: first",
        f"event Job/{JOB}-launcher: BackoffLimitExceeded: Job has reached the specified "
        "backoff limit",
        f"event Pod/{JOB}-worker-1: FailedScheduling: 0/3 nodes are available: 3 "
        "Insufficient nvidia.com/gpu."]


def test_unknown_template_fields_are_refused_naming_the_field(env, cli, monkeypatch) -> None:
    """A typo in an edited template (ttlSecondAfterFinished) is refused by strict field
    validation, as kubectl apply refuses it, in one line."""
    template = render.load_template(render.default_template())
    template["spec"]["runPolicy"]["ttlSecondAfterFinished"] = 3600
    path = env["tmp"] / "mpijob.yaml"
    path.write_text(json.dumps(template))
    with serve(env, monkeypatch, Scenario()) as server:
        code, _, err = cli(*argv(env, "--template", str(path)))
    assert code == 1
    assert err == (f"vaecf launch-mpijob: error: mpijob team-a/{JOB}: create failed: HTTP 400 "
                   'Bad Request: MPIJob in version "v2beta1" cannot be handled as a MPIJob: '
                   'strict decoding error: unknown field "spec.runPolicy.ttlSecondAfterFinished"'
                   "\n")
    assert server.cluster.jobs == {}
    assert all(r.query.get("fieldValidation") == "Strict" for r in server.cluster.seen("POST"))
    assert storage.list_keys(f"s3://{env['bucket']}/runs/{JOB}/split") == []  # unstaged


def test_the_servers_warnings_are_shown(env, cli, monkeypatch) -> None:
    scenario = Scenario(warnings=["kubeflow.org/v2beta1 MPIJob is deprecated in v1.40+"],
                        on_create=lambda job: publish_model(train_output(job)))
    with serve(env, monkeypatch, scenario):
        code, out, err = cli(*argv(env))
    assert code == 0, err
    assert (f"mpijob team-a/{JOB}: create: the API server warns: kubeflow.org/v2beta1 MPIJob is "
            "deprecated in v1.40+\n") in out


def test_the_job_carries_the_timeout_as_its_active_deadline(env, cli, monkeypatch) -> None:
    """If the step itself dies (node lost, OOM-killed), mpi-operator still stops the job."""
    scenario = Scenario(on_create=lambda job: publish_model(train_output(job)))
    with serve(env, monkeypatch, scenario) as server:
        code, _, err = cli(*argv(env, "--timeout", "7200.5"))
    assert code == 0, err
    (post,) = server.cluster.seen("POST")
    assert post.body is not None
    assert post.body["spec"]["runPolicy"]["activeDeadlineSeconds"] == 7201
    assert post.body["spec"]["runPolicy"]["ttlSecondsAfterFinished"] == 86400  # the template's


RBAC = Path(__file__).resolve().parents[2] / "manifests" / "base" / "rbac.yaml"


def rbac_verb(request: Any) -> tuple[str, str, str]:
    """(API group, resource, verb) of a request, as the API server's authorizer sees it."""
    parts = request.path.strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[parts.index("namespaces") + 2:]
    resource = "/".join([rest[0], *rest[2:]])
    named = len(rest) > 1
    verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch"}.get(request.method)
    if verb is None:
        verb = "get" if named else ("watch" if request.query.get("watch") else "list")
    return group, resource, verb


def test_the_role_grants_exactly_what_the_step_calls(env, cli, monkeypatch) -> None:
    """The audit of every flow: success with a log, a failed job replaced, a timeout with
    diagnostics. Every request is granted by the Role and every grant is used."""
    import yaml

    failed = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
              "metadata": {"name": JOB, "namespace": "team-a", "uid": "first-attempt",
                           "resourceVersion": "1"}, "spec": {},
              "status": {"conditions": [{"type": "Failed", "status": "True"}]}}
    used: set[tuple[str, str, str]] = set()
    for scenario, extra in [
            (Scenario(log_lines=["epoch 1"], existing=failed,
                      on_create=lambda job: publish_model(train_output(job))), ()),
            (Scenario(states=["Running"]), ("--timeout", "1"))]:
        with serve(env, monkeypatch, scenario) as server:
            cli(*argv(env, *extra))
        used |= {rbac_verb(r) for r in server.cluster.requests}
    (role,) = [d for d in yaml.safe_load_all(RBAC.read_text()) if d["kind"] == "Role"]
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    assert used == granted


def test_the_deadline_does_not_blame_a_healthy_server(env, cli, monkeypatch) -> None:
    """A job that is still running at the deadline of a step whose server answered every
    request: the message says so, without a 'last trouble' (the watch read that the deadline
    ended was no trouble)."""
    with serve(env, monkeypatch, Scenario(states=["Running"])):
        code, _, err = cli(*argv(env, "--timeout", "3"))
    assert code == 1
    assert err == (f"vaecf launch-mpijob: error: mpijob team-a/{JOB}: did not finish within "
                   "3 s; deleted the job\n")
