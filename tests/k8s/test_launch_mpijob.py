"""``vaecf launch-mpijob`` against a fake Kubernetes API server on loopback (real HTTP, the
real ``kubernetes`` client) and a real S3 server (moto) holding the split and the model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import FakeApiServer, Scenario

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
    # 2 ranks x 32 users; the default rule scales 1e-3 at 500 users by sqrt(64 / 500)
    assert args[args.index("--batch-size") + 1] == "64"
    assert args[args.index("--learning-rate") + 1] == "0.000357771"
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
    scenario = Scenario(states=["Running"], hold_watch=True, events=events)
    with serve(env, monkeypatch, scenario) as server:
        code, out, err = cli(*argv(env, "--timeout", "1"))
    assert code == 1
    assert (f"event Pod/{JOB}-worker-1: FailedScheduling: 0/3 nodes are available: "
            "3 Insufficient nvidia.com/gpu.") in out
    assert "Scheduled" not in out and "not ours" not in out
    assert f"mpijob team-a/{JOB} did not finish within 1 s (deleted it)" in err
    (delete,) = server.cluster.seen("DELETE")
    assert delete.path == f"/apis/kubeflow.org/v2beta1/namespaces/team-a/mpijobs/{JOB}"
    assert not env["output"].exists()


def test_sigterm_deletes_the_job(env, monkeypatch) -> None:
    with serve(env, monkeypatch, Scenario(states=["Running"], hold_watch=True)) as server:
        process = subprocess.Popen([sys.executable, "-m", "vaecf.cli", *argv(env)],
                                   env=dict(os.environ), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        try:
            assert server.cluster.watching.wait(timeout=120), "the launcher never watched"
            process.send_signal(signal.SIGTERM)
            _, err = process.communicate(timeout=120)
        finally:
            process.kill()
    assert process.returncode == 1
    assert err.strip().endswith(f"mpijob team-a/{JOB}: cancelled by SIGTERM; deleted the job")
    assert [r.path.rsplit("/", 1)[-1] for r in server.cluster.seen("DELETE")] == [JOB]
    assert JOB not in server.cluster.jobs


@pytest.mark.parametrize(("extra", "message"), [
    (["--workers", "0"], "--workers 0: expected 1..1024"),
    (["--batch-per-rank", "0"], "--batch-per-rank 0: expected >= 1"),
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
    assert render.job_name("Run_42/Retry") == "vaecf-train-run-42-retry"
    long = render.job_name("x" * 100)
    assert len(long) == 63 and long == render.job_name("x" * 100)
    assert long != render.job_name("x" * 101)


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
