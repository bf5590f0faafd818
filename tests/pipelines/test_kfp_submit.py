"""The pipeline guide's ``kfp run submit``, run with the real kfp CLI against a KFP API server on
loopback.

The kfp CLI sends every ``key=value`` as a JSON string, and a KFP 2.x backend refuses a run
whose parameter value is not of the kind the compiled pipeline declares (a number for an
integer, kubeflow/pipelines#11607). So the guide's command, the same with no parameters and with
each parameter set alone, must create a run the backend's check accepts.
"""

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
from fake_kfp_api import FakeKfp, serve, validate_inputs

from pipelines.vaecf_pipeline import compile_pipeline

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "how-to" / "kubeflow-pipeline.md"  # shows the command users type
KFP = Path(sys.executable).with_name("kfp")  # the kfp 2.13 CLI of this environment
EXAMPLE_SOURCE = "s3://vaecf/raw/ml-20m.zip"  # for the one parameter without a default


def guide_submit() -> tuple[list[str], dict[str, str]]:
    """The pipeline guide's ``kfp run submit`` command: its arguments before the parameters,
    and those."""
    text = GUIDE.read_text()
    match = re.search(r"^kfp run submit (?:.*\\\n)*.*$", text, re.MULTILINE)
    assert match, f"{GUIDE} shows no `kfp run submit` command"
    words = shlex.split(match.group(0).replace("\\\n", " "))
    params = [w for w in words if re.match(r"\w+=", w)]
    assert words[-len(params):] == params, words  # key=value pairs come last
    return words[1:-len(params)], dict(w.split("=", 1) for w in params)


@pytest.fixture(scope="module")
def kfp_api() -> Iterator[FakeKfp]:
    yield from serve()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding what ``make pipeline`` writes, ``build/vaecf_pipeline.yaml``."""
    directory = tmp_path_factory.mktemp("submit")
    compile_pipeline(directory / "build" / "vaecf_pipeline.yaml")
    (directory / "home").mkdir()  # the CLI's $HOME: no user's kfp context is read
    return directory


def declared(workdir: Path) -> dict[str, Any]:
    spec = next(yaml.safe_load_all((workdir / "build" / "vaecf_pipeline.yaml").read_text()))
    parameters: dict[str, Any] = spec["root"]["inputDefinitions"]["parameters"]
    return parameters


def example(name: str, spec: dict[str, Any], guide: dict[str, str]) -> str:
    """What a user would type for ``name``: the guide's value, else the default as text."""
    if name in guide:
        return guide[name]
    if "defaultValue" not in spec:
        return EXAMPLE_SOURCE
    default = spec["defaultValue"]
    return default if isinstance(default, str) else json.dumps(default)


def in_process(args: list[str], workdir: Path, endpoint: str) -> tuple[int, str]:
    """The kfp CLI's own entry point (``kfp.cli.cli``, as its console script calls it) in this
    process, in ``workdir`` with the environment the process gets: one CLI start-up instead of
    one per call (3-4 s each)."""
    from click.testing import CliRunner
    from kfp.cli.cli import cli
    from kfp.client import client

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        patch.setenv("KF_PIPELINES_ENDPOINT", endpoint)
        patch.setenv("HOME", str(workdir / "home"))
        # read at kfp's import, from the HOME of the time: no user's kfp context is read
        patch.setattr(client.Client, "_LOCAL_KFP_CONTEXT",
                      str(workdir / "home" / ".config" / "kfp" / "context.json"))
        result = CliRunner().invoke(cli, args, obj={}, auto_envvar_prefix="KFP")
    return result.exit_code, f"{result.output}{result.exception or ''}"


def submit(kfp_api: FakeKfp, workdir: Path, params: dict[str, str],
           process: bool = True) -> dict[str, Any]:
    """Run the guide's command with ``params`` as ``key=value`` (the kfp CLI as a process, or its
    entry point in this one); the run the server created."""
    args, _ = guide_submit()
    args += [f"{k}={v}" for k, v in params.items()]
    before = len(kfp_api.runs)
    if process:
        env = {**os.environ, "KF_PIPELINES_ENDPOINT": kfp_api.endpoint,
               "HOME": str(workdir / "home")}
        done = subprocess.run([str(KFP), *args], cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=120)
        code, err = done.returncode, done.stderr
    else:
        code, err = in_process(args, workdir, kfp_api.endpoint)
    refused = [message for body, message in kfp_api.refused
               if (body["runtime_config"].get("parameters") or {}) == params]
    assert not refused, refused
    assert code == 0, err[-2000:]
    assert len(kfp_api.runs) == before + 1
    run: dict[str, Any] = list(kfp_api.runs.values())[-1]
    return run


def test_the_guides_command_creates_a_run_the_backend_accepts(kfp_api, workdir) -> None:
    args, params = guide_submit()
    assert args[:2] == ["run", "submit"] and "build/vaecf_pipeline.yaml" in args
    run = submit(kfp_api, workdir, params)
    assert run["runtime_config"]["parameters"] == params  # sent as typed, each a string
    assert run["display_name"] == "my-run"
    (experiment,) = kfp_api.experiments.values()
    assert (experiment["display_name"], run["experiment_id"]) == (
        "vaecf", experiment["experiment_id"])
    sent = run["pipeline_spec"]["pipeline_spec"]["root"]["inputDefinitions"]["parameters"]
    assert sent == declared(workdir)


@pytest.mark.filterwarnings("ignore:This client only works:FutureWarning")
def test_no_parameters_and_each_parameter_alone_are_accepted(kfp_api, workdir) -> None:
    """The same CLI code in this process (the test above runs it as the guide's process)."""
    _, guide = guide_submit()
    assert not submit(kfp_api, workdir, {}, process=False)["runtime_config"].get("parameters")
    for name, spec in declared(workdir).items():
        params = {name: example(name, spec, guide)}
        run = submit(kfp_api, workdir, params, process=False)
        assert run["runtime_config"]["parameters"] == params


@pytest.mark.parametrize("kind, value, accepted", [
    ("NUMBER_INTEGER", 100, True), ("NUMBER_INTEGER", 1e2, True),
    ("NUMBER_INTEGER", "100", False), ("NUMBER_INTEGER", True, False),
    ("NUMBER_DOUBLE", 0.5, True), ("STRING", "100", True), ("STRING", 100, False),
    ("BOOLEAN", True, True), ("BOOLEAN", "true", False), ("LIST", [1], True),
    ("STRUCT", {}, True), ("STRUCT", [], False)])
def test_the_fake_server_checks_types_as_the_backend(kind, value, accepted) -> None:
    problem = validate_inputs({"p": {"parameterType": kind}}, {"p": value})
    assert (problem is None) == accepted, problem
    if kind == "NUMBER_INTEGER" and not accepted:  # the backend's words (#11607)
        assert problem == ("input parameter p requires type double or integer, but the "
                           "parameter value is not of number value type")


def test_the_fake_server_checks_presence_as_the_backend() -> None:
    required = {"p": {"parameterType": "STRING"}}
    assert validate_inputs(required, {}) == (
        "parameter p is not optional, yet has neither default value nor user provided value")
    assert validate_inputs({"p": {"parameterType": "STRING", "isOptional": True}}, {}) is None
    assert validate_inputs({}, {"q": "1"}) == (
        "parameter(s) provided are not required by pipeline: q")
