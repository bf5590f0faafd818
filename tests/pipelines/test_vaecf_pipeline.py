"""The compiled pipeline, compiled by the real KFP compiler and read back as YAML.

The golden file ``vaecf_pipeline.golden.yaml`` is the compile with default images; after an
intended change regenerate it with
``.venv/bin/python -m pipelines.vaecf_pipeline --output tests/pipelines/vaecf_pipeline.golden.yaml``
and review the diff.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.images import Images, load_digests
from pipelines.vaecf_pipeline import compile_pipeline
from vaecf import cli
from vaecf.cli import build_parser
from vaecf.errors import VaecfError
from vaecf.k8s import render
from vaecf.stages import MAX_SEED, kfp_report
from vaecf.stages.launch_mpijob import params_from_args
from vaecf.train.config import DEFAULT_MAX_EPOCHS, DEFAULT_PATIENCE

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("vaecf_pipeline.golden.yaml")
ORDER = ["download", "preprocess", "split", "train", "evaluate", "report"]
RUN_ID = "0d6c1f0e-3b1a-4c55-9a51-b2a3f40e5a77"  # what KFP puts in {{$.pipeline_job_uuid}}
DIGEST = "sha256:" + "ab" * 32
SERVE = "condition-4"  # the optional serve step's condition (serve=true)
BRANCHES = "condition-branches-1"  # engine=spark (condition-2) or else pandas (condition-3)
SPARK, PANDAS = "condition-2", "condition-3"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any],
                                                                 dict[str, Any]]:
    path = compile_pipeline(tmp_path_factory.mktemp("pipeline") / "vaecf.yaml")
    text = path.read_text()
    spec, platform = yaml.safe_load_all(text)
    return text, spec, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def tasks(spec: dict[str, Any]) -> dict[str, Any]:
    return dict(spec["root"]["dag"]["tasks"])


def all_tasks(spec: dict[str, Any]) -> dict[str, Any]:
    """Every task by name: the root DAG's and those inside conditions."""
    found = tasks(spec)
    for component in spec["components"].values():
        found.update(component.get("dag", {}).get("tasks", {}))
    return found


def branch(spec: dict[str, Any], condition: str) -> dict[str, list[str]]:
    """A condition's tasks and what each waits for."""
    dag = spec["components"][f"comp-{condition}"]["dag"]["tasks"]
    return {name: sorted(task.get("dependentTasks", [])) for name, task in dag.items()}


def container(spec: dict[str, Any], task: str) -> dict[str, Any]:
    return dict(spec["deploymentSpec"]["executors"][f"exec-{task}"]["container"])


def test_six_tasks_run_in_pipeline_order(compiled) -> None:
    _, spec, _ = compiled
    root = {name: sorted(task.get("dependentTasks", [])) for name, task in tasks(spec).items()
            if name != SERVE}
    assert root == {"download": [], BRANCHES: ["download"], "train": [BRANCHES],
                    "evaluate": [BRANCHES, "train"], "report": [BRANCHES, "evaluate", "train"]}
    assert branch(spec, PANDAS) == {"preprocess": [], "split": ["preprocess"]}
    assert branch(spec, SPARK) == {"spark-preprocess": [], "spark-split": ["spark-preprocess"]}
    graph = {**root, "preprocess": ["download"], "split": ["preprocess"]}  # engine=pandas
    for name, deps in graph.items():
        graph[name] = ["split" if d == BRANCHES else d for d in deps]
    del graph[BRANCHES]
    done: list[str] = []
    while len(done) < len(graph):  # the only topological order
        ready = [n for n, deps in graph.items() if n not in done and set(deps) <= set(done)]
        assert len(ready) == 1, ready
        done += ready
    assert done == ORDER


def test_images_and_commands(compiled) -> None:
    _, spec, _ = compiled
    default = Images()
    expected = {"download": (default.data, ["vaecf", "download"]),
                "preprocess": (default.data, ["vaecf", "preprocess"]),
                "split": (default.data, ["vaecf", "split"]),
                "train": (default.launcher, ["vaecf", "launch-mpijob"]),
                "evaluate": (default.train, ["vaecf", "evaluate"]),
                "report": (default.launcher, ["python", "-m", "vaecf.stages.kfp_report"])}
    for task, (image, command) in expected.items():
        assert (container(spec, task)["image"], container(spec, task)["command"]) == (
            image, command), task
    assert default.data == "ghcr.io/vaecf/vaecf-data:0.1.0"


def resolve(arg: Any, values: dict[str, Any], artifacts: dict[str, str]) -> list[str]:
    """One compiled argument as the KFP backend would expand it (IfPresent, Concat)."""
    if isinstance(arg, str) and arg.startswith('{"'):
        node = json.loads(arg)
        if "IfPresent" in node:
            present = values.get(node["IfPresent"]["InputName"]) is not None
            return [x for a in node["IfPresent"]["Then"] for x in resolve(a, values,
                                                                             artifacts)] \
                if present else []
        return ["".join(x for a in node["Concat"] for x in resolve(a, values, artifacts))]
    text = re.sub(r"\{\{\$\.inputs\.parameters\['(\w+)'\]\}\}",
                  lambda m: str(values[m.group(1)]), str(arg))
    text = re.sub(r"\{\{\$\.(?:inputs|outputs)\.artifacts\['(\w+)'\]\.path\}\}",
                  lambda m: artifacts[m.group(1)], text)
    return [text.replace("{{$}}", '{"outputs": {}}')]


def task_values(spec: dict[str, Any], task: str) -> dict[str, Any]:
    """Each input parameter's value in a run with the pipeline's defaults."""
    root = spec["root"]["inputDefinitions"]["parameters"]
    component = spec["components"][f"comp-{task}"]["inputDefinitions"].get("parameters", {})
    values = {name: p.get("defaultValue") for name, p in component.items()}
    for name, source in all_tasks(spec)[task]["inputs"].get("parameters", {}).items():
        if "componentInputParameter" in source:  # a pipeline parameter, maybe via a condition
            parameter = source["componentInputParameter"].removeprefix("pipelinechannel--")
            values[name] = root[parameter].get("defaultValue")
        else:
            values[name] = source["runtimeValue"]["constant"].replace(
                "{{$.pipeline_job_uuid}}", RUN_ID)
    for name, value in values.items():
        if component.get(name, {}).get("parameterType") == "NUMBER_INTEGER" and value:
            values[name] = int(value)
    return values


def command_line(spec: dict[str, Any], task: str, **override: Any) -> list[str]:
    values = {**task_values(spec, task), **override}
    artifacts = {"raw": "/kfp/raw", "interactions": "/kfp/interactions", "split": "/kfp/split",
                 "model": "/kfp/model", "evaluation": "/kfp/evaluation",
                 "report": "/kfp/report", "markdown": "/kfp/report.md",
                 "html": "/kfp/report.html", "metrics": "/kfp/metrics"}
    args = container(spec, task)["args"]
    return [x for arg in args for x in resolve(arg, values, artifacts)]


@pytest.mark.parametrize("task", ["download", "preprocess", "split", "train", "evaluate",
                                  "spark-preprocess", "spark-split"])
def test_every_flag_parses_with_the_real_cli(compiled, task) -> None:
    _, spec, _ = compiled
    stage = container(spec, task)["command"][1]
    args = build_parser(stage).parse_args(command_line(spec, task))
    if task == "download":
        assert (args.dataset, args.source, args.seed) == ("synthetic", None, 98765)
        with_source = command_line(spec, task, source="s3://vaecf/raw/ml-20m.zip")
        assert build_parser(stage).parse_args(with_source).source == "s3://vaecf/raw/ml-20m.zip"
    if task == "train":
        assert (args.store, args.run_id, args.workers, args.gpus_per_worker) == (
            "s3://vaecf/runs", RUN_ID, 2, 1)
        assert (args.epochs, args.precision, args.secret_name) == (0, "mixed_bfloat16",
                                                                   "vaecf-s3")
        # epochs 0: the MPIJob trains as `vaecf train` does without --epochs (stops early)
        assert (args.patience, args.max_epochs) == (DEFAULT_PATIENCE, DEFAULT_MAX_EPOCHS)
        train_line = render.train_command(params_from_args(args))
        assert "--epochs" not in train_line
        assert train_line[train_line.index("--patience") + 1] == str(DEFAULT_PATIENCE)
        assert train_line[train_line.index("--max-epochs") + 1] == str(DEFAULT_MAX_EPOCHS)
        # the GPU step's measured defaults (README "Results"), the MPIJob's as well
        assert (args.precision, args.xla == "true") == (render.MPIJobParams.precision,
                                                        render.MPIJobParams.xla)
        assert build_parser(stage).parse_args(
            command_line(spec, task, xla="false")).xla == "false"
        # the MPIJob's multi-GPU defaults (vaecf.k8s.render), kept in step with the pipeline's
        assert (args.batch_per_rank, args.lr_scaling) == (render.BATCH_PER_RANK,
                                                          render.LR_SCALING)
        assert (args.compression, args.nccl_debug) == ("none", "WARN")
        assert args.image == Images().train and args.output == "/kfp/model"
    if task == "evaluate":
        assert (args.split, args.model, args.output) == ("/kfp/split", "/kfp/model",
                                                         "/kfp/evaluation")
    if task in ("preprocess", "split"):
        assert args.engine == "pandas"
    if task.startswith("spark-"):
        assert (args.stage, args.store, args.run_id, args.image) == (
            task.removeprefix("spark-"), "s3://vaecf/runs", RUN_ID, Images().ref("spark"))
        assert (args.input, args.output) == {
            "spark-preprocess": ("/kfp/raw", "/kfp/interactions"),
            "spark-split": ("/kfp/interactions", "/kfp/split")}[task]
        assert (args.executors, args.executor_memory, args.secret_name) == (2, "4g",
                                                                            "vaecf-s3")


def test_a_table_datasets_columns_reach_download_as_its_flags(compiled) -> None:
    _, spec, _ = compiled
    root = spec["root"]["inputDefinitions"]["parameters"]
    names = ("user_column", "item_column", "value_column", "value_kind")
    for name in names:
        assert root[name] == {"isOptional": True, "parameterType": "STRING"}, name
        assert tasks(spec)["download"]["inputs"]["parameters"][name] == {
            "componentInputParameter": name}
    assert not {"--user-column", "--value-kind"} & set(command_line(spec, "download"))
    given = dict(zip(names, ("customer", "sku", "quantity", "plays"), strict=True))
    line = command_line(spec, "download", dataset="table", source="s3://logs/2024/", **given)
    args = build_parser("download").parse_args(line)
    assert (args.dataset, args.source) == ("table", "s3://logs/2024/")
    assert {name: getattr(args, name) for name in names} == given


@pytest.mark.parametrize("task, name", [("download", "seed"), ("split", "seed"),
                                        ("train", "seed"), ("train", "epochs"),
                                        ("train", "patience"), ("train", "max_epochs"),
                                        ("train", "batch_per_rank"), ("train", "workers"),
                                        ("train", "gpus_per_worker")])
def test_a_number_parameter_given_as_text_is_checked_by_the_stage(compiled, task, name,
                                                                  capsys) -> None:
    # Pipeline parameters are strings (`kfp run submit` sends strings): the stage CLI parses
    # them, and a value that is not a number stops that step with a line naming the flag.
    _, spec, _ = compiled
    root = spec["root"]["inputDefinitions"]["parameters"]
    assert root[name]["parameterType"] == "STRING"
    stage = container(spec, task)["command"][1]
    flag = "--" + name.replace("_", "-")
    assert getattr(build_parser(stage).parse_args(command_line(spec, task, **{name: "64"})),
                   name) == 64
    capsys.readouterr()
    assert cli.main([stage, *command_line(spec, task, **{name: "1OO"})]) == 1
    what = (f"expected an integer from 0 to {MAX_SEED}, got 1OO" if name == "seed"
            else "invalid int value: '1OO'")
    assert capsys.readouterr().err.strip().splitlines() == [
        f"vaecf {stage}: error: argument {flag}: {what} (see 'vaecf {stage} --help')"]


def test_report_flags_parse_with_both_real_parsers(compiled) -> None:
    _, spec, _ = compiled
    args = kfp_report.build_parser().parse_args(command_line(spec, "report"))
    assert (args.markdown, args.html) == (Path("/kfp/report.md"), Path("/kfp/report.html"))
    assert (args.metrics_artifact, args.metrics_path) == ("metrics", Path("/kfp/metrics"))
    assert json.loads(args.executor_input) == {"outputs": {}}
    report = build_parser("report").parse_args(args.report_args)
    assert (report.output, report.train_log, report.metrics) == (
        "/kfp/report", "/kfp/model/train_log.jsonl", "/kfp/evaluation/metrics.json")
    assert report.manifests == ["/kfp/split", "/kfp/model", "/kfp/evaluation"]


def test_gpus_on_evaluate_and_through_the_mpijob_on_train(compiled) -> None:
    _, spec, platform = compiled
    accelerator = container(spec, "evaluate")["resources"]["accelerator"]
    assert (accelerator["resourceType"], accelerator["resourceCount"]) == ("nvidia.com/gpu",
                                                                           "1")
    assert platform["exec-evaluate"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert platform["exec-evaluate"]["nodeSelector"] == {
        "labels": {"nvidia.com/gpu.present": "true"}}
    # The train step's pod only watches; its GPUs are the MPIJob workers', set by flags.
    assert "resources" not in container(spec, "train")
    wired = tasks(spec)["train"]["inputs"]["parameters"]
    assert wired["gpus_per_worker"] == {"componentInputParameter": "gpus_per_worker"}
    assert wired["workers"] == {"componentInputParameter": "workers"}


def test_s3_credentials_by_secret_reference_only(compiled) -> None:
    text, spec, platform = compiled
    for task in ("download", "train", "deploy"):
        (secret,) = platform[f"exec-{task}"]["secretAsEnv"]
        assert secret["secretNameParameter"] == {"componentInputParameter": "s3_secret"}
        assert {e["envVar"]: e["secretKey"] for e in secret["keyToEnv"]} == {
            "AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY",
            "AWS_ENDPOINT_URL": "AWS_ENDPOINT_URL"}
    assert {t for t, p in platform.items() if "secretAsEnv" in p} == {
        "exec-download", "exec-train", "exec-deploy", "exec-spark-preprocess",
        "exec-spark-split"}
    assert all("env" not in container(spec, task) for task in ORDER)
    mentions = [line.strip() for line in text.splitlines() if "AWS_" in line]
    assert len(mentions) == 30  # 3 keys x (envVar, secretKey) x 5 tasks, names only
    assert all(re.fullmatch(r"(- envVar|secretKey): AWS_[A-Z_]+", m) for m in mentions)
    assert "password" not in text.lower() and "testing" not in text


def test_retries_on_io_steps_and_no_cache_for_training(compiled) -> None:
    _, spec, _ = compiled
    retried = {name for name, task in all_tasks(spec).items() if "retryPolicy" in task}
    assert retried == {"download", "train", "deploy", "spark-preprocess", "spark-split"}
    assert tasks(spec)["download"]["retryPolicy"]["maxRetryCount"] == 3
    caching = {name: task["cachingOptions"].get("enableCache", False)
               for name, task in all_tasks(spec).items() if name in ORDER}
    assert caching == {name: name != "train" for name in ORDER}


def test_nothing_run_specific_is_baked_in(compiled) -> None:
    text, spec, _ = compiled
    uuid = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    assert not re.search(uuid, text)
    assert not re.search(r"\b20\d\d-\d\d-\d\d[T ]\d\d:\d\d", text)
    assert not re.search(r"\b1[6-9]\d{8}\b", text)  # epoch seconds
    assert "namespace" not in text
    assert tasks(spec)["train"]["inputs"]["parameters"]["run_id"] == {
        "runtimeValue": {"constant": "{{$.pipeline_job_uuid}}"}}


def test_golden_equals_a_fresh_compile(compiled, tmp_path) -> None:
    text, _, _ = compiled
    again = compile_pipeline(tmp_path / "again.yaml").read_text()
    assert again == text
    assert GOLDEN.read_text() == text, f"regenerate {GOLDEN.name} (see module docstring)"


def test_compile_entry_point_pins_images_by_digest(tmp_path) -> None:
    digests = tmp_path / "digests.json"
    digests.write_text(json.dumps({"train": DIGEST, "launcher": DIGEST}))
    output = tmp_path / "pinned.yaml"
    subprocess.run([sys.executable, "-m", "pipelines.vaecf_pipeline", "--output", str(output),
                    "--registry", "registry.example/ml", "--tag", "1.2.3",
                    "--digests", str(digests)], cwd=ROOT, check=True, capture_output=True)
    spec = next(yaml.safe_load_all(output.read_text()))
    assert container(spec, "download")["image"] == "registry.example/ml/vaecf-data:1.2.3"
    assert container(spec, "train")["image"] == f"registry.example/ml/vaecf-launcher@{DIGEST}"
    assert container(spec, "evaluate")["image"] == f"registry.example/ml/vaecf-train@{DIGEST}"
    train_image = spec["root"]["inputDefinitions"]["parameters"]["train_image"]
    assert train_image["defaultValue"] == f"registry.example/ml/vaecf-train@{DIGEST}"


def test_components_and_pipelines_import_only_stdlib_and_kfp() -> None:
    allowed = set(sys.stdlib_module_names) | {"kfp", "components", "pipelines"}
    files = sorted((ROOT / "components").rglob("*.py")) + sorted(
        (ROOT / "pipelines").rglob("*.py"))
    assert len(files) >= 14
    for path in files:
        for node in ast.parse(path.read_text()).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] in allowed, f"{path}: imports {name}"


def test_make_push_records_digests_that_make_pipeline_pins(tmp_path) -> None:
    """``make push`` then ``make pipeline`` with a stand-in container tool (no registry)."""
    tool = tmp_path / "fake-docker"
    calls = tmp_path / "calls.txt"
    tool.write_text("#!/bin/sh\n"
                    f'echo "$*" >> {calls}\n'
                    'if [ "$1 $2" = "image inspect" ]; then\n'
                    '  eval image=\\${$#}; repo=${image%:*}\n'
                    f'  echo "other.example/x@sha256:{"cd" * 32}"; echo "$repo@{DIGEST}"\n'
                    "fi\n")
    tool.chmod(0o755)
    digests, output = tmp_path / "digests.json", tmp_path / "pipeline.yaml"
    subprocess.run(["make", "-s", "-o", "install", "push", "pipeline", f"CONTAINER_TOOL={tool}",
                    "REGISTRY=registry.example/ml", "TAG=2.0", f"DIGESTS={digests}",
                    f"PIPELINE_YAML={output}", f"PY={sys.executable}"],
                   cwd=ROOT, check=True, capture_output=True)
    assert json.loads(digests.read_text()) == {"data": DIGEST, "train": DIGEST,
                                               "launcher": DIGEST, "serve": DIGEST,
                                               "spark": DIGEST}
    lines = calls.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["build"] * 6 + ["push", "image"] * 5 + ["push"]
    assert lines[0].startswith("build -f docker/data.Dockerfile -t "
                               "registry.example/ml/vaecf-data:2.0")
    assert lines[4].startswith("build -f docker/spark.Dockerfile -t "
                               "registry.example/ml/vaecf-spark:2.0")
    # The CPU flavour of the train image (manifests/overlays/cpu) is built and pushed by tag.
    assert lines[5] == ("build -f docker/train.Dockerfile --build-arg FLAVOUR=cpu "
                        "-t registry.example/ml/vaecf-train-cpu:2.0 .")
    assert lines[-1] == "push registry.example/ml/vaecf-train-cpu:2.0"
    spec = next(yaml.safe_load_all(output.read_text()))
    images = {container(spec, task)["image"] for task in ORDER}
    assert images == {f"registry.example/ml/vaecf-{n}@{DIGEST}" for n in ("data", "train",
                                                                          "launcher")}


def test_serve_step_is_optional_off_by_default_and_parses(compiled) -> None:
    _, spec, _ = compiled
    root = spec["root"]["inputDefinitions"]["parameters"]
    assert root["serve"]["defaultValue"] == "false"
    assert root["serve_image"]["defaultValue"] == Images().serve
    condition = tasks(spec)[SERVE]
    assert condition["triggerPolicy"]["condition"] == (
        "inputs.parameter_values['pipelinechannel--serve'] == 'true'")
    assert sorted(condition["dependentTasks"]) == ["evaluate", "train"]
    step = spec["components"][f"comp-{SERVE}"]["dag"]["tasks"]["deploy"]
    assert step["cachingOptions"] == {}  # never cached: each run deploys its own model
    assert container(spec, "deploy")["image"] == Images().launcher
    assert container(spec, "deploy")["command"] == ["vaecf", "deploy"]
    values = {"run_id": RUN_ID, "s3_bucket": root["s3_bucket"]["defaultValue"],
              "s3_prefix": root["s3_prefix"]["defaultValue"],
              "serve_image": Images().serve, "name": "vaecf"}
    argv = [x for arg in container(spec, "deploy")["args"]
            for x in resolve(arg, values, {"model": "/kfp/model"})]
    args = build_parser("deploy").parse_args(argv)
    assert (args.model, args.store, args.image) == ("/kfp/model", "s3://vaecf/runs",
                                                    Images().serve)
    assert "retryPolicy" in step  # reads the model in S3, talks to the API server


def test_engine_spark_runs_preprocess_and_split_as_sparkapplications(compiled) -> None:
    """engine=spark takes the Spark branch (its launcher steps), anything else the pandas
    steps, which pass the value on (a typo stops preprocess with one line); both branches
    publish the one split artifact that train, evaluate and report read."""
    _, spec, _ = compiled
    root = spec["root"]["inputDefinitions"]["parameters"]
    assert root["engine"]["defaultValue"] == "pandas"
    assert root["spark_image"]["defaultValue"] == Images().ref("spark")
    conditions = spec["components"][f"comp-{BRANCHES}"]["dag"]["tasks"]
    assert conditions[SPARK]["triggerPolicy"]["condition"] == (
        "inputs.parameter_values['pipelinechannel--engine'] == 'spark'")
    assert conditions[PANDAS]["triggerPolicy"]["condition"] == (
        "!(inputs.parameter_values['pipelinechannel--engine'] == 'spark')")
    (oneof,) = spec["components"][f"comp-{BRANCHES}"]["dag"]["outputs"]["artifacts"].values()
    assert {(s["producerSubtask"], s["outputArtifactKey"]) for s in oneof["artifactSelectors"]} \
        == {(SPARK, "pipelinechannel--spark-split-split"),
            (PANDAS, "pipelinechannel--split-split")}
    for task in ("train", "evaluate", "report"):
        assert tasks(spec)[task]["inputs"]["artifacts"]["split"]["taskOutputArtifact"][
            "producerTask"] == BRANCHES
    for task in ("spark-preprocess", "spark-split"):
        assert container(spec, task)["image"] == Images().launcher
        assert container(spec, task)["command"] == ["vaecf", "launch-sparkapp"]
        assert all_tasks(spec)[task]["inputs"]["parameters"]["run_id"] == {
            "runtimeValue": {"constant": "{{$.pipeline_job_uuid}}"}}
    assert build_parser("preprocess").parse_args(
        command_line(spec, "preprocess", engine="spark")).engine == "spark"
    with pytest.raises(VaecfError, match="argument --engine: invalid choice: 'Spark'"):
        build_parser("preprocess").parse_args(command_line(spec, "preprocess", engine="Spark"))


def test_image_refs_and_digest_file_validation(tmp_path) -> None:
    pinned = Images("registry.example/ml/", "9.9", {"train": DIGEST})
    assert (pinned.data, pinned.train) == ("registry.example/ml/vaecf-data:9.9",
                                           f"registry.example/ml/vaecf-train@{DIGEST}")
    with pytest.raises(ValueError, match="unknown image 'gpu'"):
        pinned.ref("gpu")
    bad = tmp_path / "digests.json"
    bad.write_text(json.dumps({"train": "sha256:short"}))
    with pytest.raises(ValueError, match="train: expected one of"):
        load_digests(bad)
