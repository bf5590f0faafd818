"""The tuning sweep, compiled by the real KFP compiler and read back; submitted with the real
kfp CLI to the KFP API on loopback, as the pipeline guide shows."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_kfp_api import FakeKfp, serve

from pipelines.vaecf_sweep import DEFAULT_TRIALS, PARALLELISM, compile_sweep, load_trials
from vaecf.cli import build_parser
from vaecf.stages.tune import collected_paths
from vaecf.tuning.space import DEFAULT_SPACE, parse_trial, search, trials

ROOT = Path(__file__).resolve().parents[2]
KFP = Path(sys.executable).with_name("kfp")
TASK_ID = "7d1e0c52-1c1f-4a0e-8f5e-3c5b0c2d9a11"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = compile_sweep(tmp_path_factory.mktemp("sweep") / "build" / "vaecf_sweep.yaml")
    spec = next(yaml.safe_load_all(path.read_text()))
    spec["_path"] = path
    return spec


def executor(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(spec["deploymentSpec"]["executors"][f"exec-{name}"]["container"])


def resolved_args(spec: dict[str, Any], name: str, values: dict[str, str]) -> list[str]:
    """A step's arguments with KFP's placeholders replaced as the backend would."""
    out = []
    for arg in executor(spec, name)["args"]:
        arg = str(arg)
        if arg.startswith('{"Concat"'):  # dsl.ConcatPlaceholder
            arg = "".join(json.loads(arg)["Concat"])
        arg = arg.replace("{{$.pipeline_task_uuid}}", TASK_ID)
        for key, value in values.items():
            arg = arg.replace(f"{{{{$.inputs.parameters['{key}']}}}}", value)
        # Any other parameter: "1" (every numeric flag accepts it; strings take it as text).
        arg = re.sub(r"\{\{\$\.inputs\.parameters\['\w+'\]\}\}", "1", arg)
        arg = re.sub(r"\{\{\$\.inputs\.artifacts\['(\w+)'\]\.path\}\}", r"/tmp/in/\1", arg)
        arg = re.sub(r"\{\{\$\.outputs\.artifacts\['(\w+)'\]\.path\}\}", r"/tmp/out/\1", arg)
        out.append(arg)
    return out


def test_the_dag_fans_out_over_the_trials_and_in_to_one_test(compiled) -> None:
    root = compiled["root"]["dag"]["tasks"]
    assert {n: sorted(t.get("dependentTasks", [])) for n, t in root.items()} == {
        "download": [], "preprocess": ["download"], "split": ["preprocess"],
        "for-loop-2": ["split"], "select-best": ["for-loop-2", "split"],
        "tuning-report": ["select-best", "split"]}
    loop = root["for-loop-2"]
    assert loop["iteratorPolicy"]["parallelismLimit"] == PARALLELISM
    assert json.loads(loop["parameterIterator"]["items"]["raw"]) == DEFAULT_TRIALS
    body = compiled["components"]["comp-for-loop-2"]["dag"]["tasks"]
    assert {n: sorted(t.get("dependentTasks", [])) for n, t in body.items()} == {
        "train": [], "validate-trial": ["train"]}
    collected = compiled["components"]["comp-select-best"]["inputDefinitions"]["artifacts"]
    assert collected["models"]["isArtifactList"] and collected["evaluations"]["isArtifactList"]


def test_the_default_trials_are_vaecf_tunes_default_trials() -> None:
    points = [parse_trial(text, "trial") for text in DEFAULT_TRIALS]  # each a valid point
    assert points == search(DEFAULT_SPACE, 8, seed=0)  # train's defaults first, in order
    assert len(points) == len(trials(DEFAULT_SPACE, 1000, seed=0))  # the whole grid


def test_each_step_passes_flags_its_cli_accepts(compiled) -> None:
    trial = DEFAULT_TRIALS[3]
    train = resolved_args(compiled, "train", {"hyperparameters": trial, "run_id": TASK_ID,
                                              "s3_bucket": "b", "s3_prefix": "sweeps",
                                              "precision": "fp32", "xla": "false"})
    args = build_parser("launch-mpijob").parse_args(train)
    assert (args.hyperparameters, args.run_id) == (trial, TASK_ID)  # one MPIJob per trial
    assert (args.precision, args.xla) == ("fp32", "false")
    validate = build_parser("evaluate").parse_args(resolved_args(compiled, "validate-trial", {}))
    assert (validate.subset, validate.baselines) == ("val", [])
    best = build_parser("tune").parse_args(resolved_args(compiled, "select-best", {}))
    assert best.executor_input == "{{$}}" and best.split == "/tmp/in/split"
    command = executor(compiled, "tuning-report")["args"]
    report = build_parser("report").parse_args(
        resolved_args(compiled, "tuning-report", {})[command.index("--") + 1:])
    assert report.trials == "/tmp/in/tuning/trials.jsonl"
    assert report.metrics == "/tmp/in/tuning/test/metrics.json"


def test_the_fan_in_reads_the_collected_artifacts_in_order() -> None:
    executor_input = {"inputs": {"artifacts": {
        "models": {"artifacts": [{"uri": "s3://vaecf/sweeps/t0/model"},
                                 {"uri": "minio://mlpipeline/v2/t1/model"}]},
        "evaluations": {"artifacts": [{"uri": "gs://b/t0/evaluation"},
                                      {"uri": "/local/t1/evaluation"}]}}}}
    text = json.dumps(executor_input)
    assert collected_paths(text, "models") == ["/s3/vaecf/sweeps/t0/model",
                                               "/minio/mlpipeline/v2/t1/model"]
    assert collected_paths(text, "evaluations") == ["/gcs/b/t0/evaluation",
                                                    "/local/t1/evaluation"]


def test_trials_from_a_file_are_compiled_in(tmp_path: Path) -> None:
    (tmp_path / "trials.json").write_text('[{"beta_cap": 0.3}, {"beta_cap": 0.5, "epochs": 9}]')
    listed = load_trials(tmp_path / "trials.json")
    path = compile_sweep(tmp_path / "sweep.yaml", parallelism=2, trials=listed)
    loop = next(yaml.safe_load_all(path.read_text()))["root"]["dag"]["tasks"]["for-loop-2"]
    assert json.loads(loop["parameterIterator"]["items"]["raw"]) == [
        '{"beta_cap": 0.3}', '{"beta_cap": 0.5, "epochs": 9}']
    assert loop["iteratorPolicy"]["parallelismLimit"] == 2


@pytest.fixture(scope="module")
def kfp_api() -> Iterator[FakeKfp]:
    yield from serve()


def readme_sweep_submit() -> list[str]:
    text = (ROOT / "docs" / "how-to" / "kubeflow-pipeline.md").read_text()
    match = re.search(r"^kfp run submit .*vaecf_sweep\.yaml(?:.*\\\n)*.*$", text, re.MULTILINE)
    assert match, "the pipeline guide shows no `kfp run submit` of the sweep"
    return shlex.split(match.group(0).replace("\\\n", " "))[1:]


def test_readme_sweep_command_creates_a_run_the_backend_accepts(kfp_api, compiled) -> None:
    words = readme_sweep_submit()
    params = dict(w.split("=", 1) for w in words if re.match(r"\w+=", w))
    workdir = compiled["_path"].parent.parent  # holds build/vaecf_sweep.yaml
    (workdir / "home").mkdir(exist_ok=True)
    env = {**os.environ, "KF_PIPELINES_ENDPOINT": kfp_api.endpoint,
           "HOME": str(workdir / "home")}
    done = subprocess.run([str(KFP), *words], cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    assert not kfp_api.refused, kfp_api.refused
    assert done.returncode == 0, done.stderr[-2000:]
    run = list(kfp_api.runs.values())[-1]
    assert run["runtime_config"]["parameters"] == params and "dataset" in params
    sent = run["pipeline_spec"]["pipeline_spec"]
    assert sent["pipelineInfo"]["name"] == "vaecf-sweep"
    declared = sent["root"]["inputDefinitions"]["parameters"]
    assert all(p["parameterType"] == "STRING" for p in declared.values())
