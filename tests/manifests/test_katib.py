"""The Katib Experiment of manifests/tuning: rendered by code, and checked as Katib's webhook
would (its CRD has no schema): enums, metric names, every ${trialParameters.X} resolved, the
primary container and pod labels of an MPIJob v2beta1 launcher, the trial's MPIJob itself."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from vaecf.cli import build_parser
from vaecf.k8s import katib, render
from vaecf.tuning.space import check_trial

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "manifests" / "tuning" / "experiment.yaml"
CRD = Path(__file__).with_name("schemas") / "mpijob-crd-v2beta1.yaml"
# Katib v0.19 (pkg/apis/controller/...v1beta1): the values its webhook accepts.
OBJECTIVE_TYPES = {"maximize", "minimize"}
PARAMETER_TYPES = {"int", "double", "discrete", "categorical"}
ALGORITHMS = {"random", "grid", "tpe", "multivariate-tpe", "cmaes", "sobol", "bayesianoptimization",
              "hyperband", "enas", "darts", "pbt"}
COLLECTORS = {"StdOut", "File", "TensorFlowEvent", "PrometheusMetric", "Custom", "None"}
STRATEGIES = {"min", "max", "latest"}
PLACEHOLDER = re.compile(r"\$\{trialParameters\.([^}]+)\}")
# Katib v0.19's default StdOut filter (pkg/metricscollector/v1beta1/common/const.go).
KATIB_DEFAULT_FILTER = re.compile(r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)")


@pytest.fixture(scope="module")
def shipped() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(SHIPPED.read_text())
    return document


def launcher(job: dict[str, Any]) -> dict[str, Any]:
    pod = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]
    return {"labels": pod.get("metadata", {}).get("labels", {}),
            "container": pod["spec"]["containers"][0]}


def test_the_shipped_file_is_the_rendering() -> None:
    template = render.load_template(ROOT / "manifests" / "mpijob.yaml")
    assert SHIPPED.read_text() == katib.to_yaml(katib.experiment(template)), (
        "regenerate: python -m vaecf.k8s.katib --output manifests/tuning/experiment.yaml")


def test_the_experiment_goes_where_it_is_applied(shipped) -> None:
    """No namespace in the file: `kubectl apply -n <ns>` puts it (and so its trials, which
    need the Secret and the collector label there) in the user's namespace."""
    assert "namespace" not in shipped["metadata"]
    assert "namespace" not in shipped["spec"]["trialTemplate"]["trialSpec"]["metadata"]


def test_enums_and_the_objective(shipped) -> None:
    spec = shipped["spec"]
    assert (shipped["apiVersion"], shipped["kind"]) == ("kubeflow.org/v1beta1", "Experiment")
    objective = spec["objective"]
    assert objective["type"] in OBJECTIVE_TYPES and objective["type"] == "maximize"
    assert objective["objectiveMetricName"] == "ndcg_at_100"
    names = {objective["objectiveMetricName"], *objective["additionalMetricNames"]}
    assert {s["name"] for s in objective["metricStrategies"]} == names
    assert {s["value"] for s in objective["metricStrategies"]} <= STRATEGIES
    assert spec["algorithm"]["algorithmName"] in ALGORITHMS
    assert spec["metricsCollectorSpec"]["collector"]["kind"] in COLLECTORS
    assert 1 <= spec["parallelTrialCount"] <= spec["maxTrialCount"]
    for parameter in spec["parameters"]:
        assert parameter["parameterType"] in PARAMETER_TYPES
        values = parameter["feasibleSpace"]["list"]
        assert values and all(isinstance(v, str) for v in values)
        for value in values:  # each a value vaecf train accepts
            check_trial({parameter["name"]: json.loads(value)}, parameter["name"])


def test_every_trial_parameter_is_defined_and_every_parameter_used(shipped) -> None:
    template = shipped["spec"]["trialTemplate"]
    defined = {p["name"]: p["reference"] for p in template["trialParameters"]}
    used = set(PLACEHOLDER.findall(json.dumps(template["trialSpec"])))
    assert used == set(defined)
    parameters = {p["name"] for p in shipped["spec"]["parameters"]}
    meta = {r for r in defined.values() if r.startswith("${trialSpec.")}
    assert meta == {"${trialSpec.Name}"}  # Katib's own metadata references
    assert set(defined.values()) - meta == parameters


def test_the_trial_is_the_mpijob_and_its_launcher_is_primary(shipped) -> None:
    template = shipped["spec"]["trialTemplate"]
    job = template["trialSpec"]
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    assert template["primaryPodLabels"] == {"training.kubeflow.org/job-role": "launcher"}
    assert "mpi-job-role" not in json.dumps(template)  # the v1 label never matches v2beta1
    assert launcher(job)["container"]["name"] == template["primaryContainerName"]
    assert "Succeeded" in template["successCondition"]
    assert "Failed" in template["failureCondition"]


def substituted(shipped: dict[str, Any], values: dict[str, str]) -> dict[str, Any]:
    """The trial's MPIJob as Katib creates it for one suggestion."""
    template = shipped["spec"]["trialTemplate"]
    text = json.dumps(template["trialSpec"])
    for entry in template["trialParameters"]:
        text = text.replace(f"${{trialParameters.{entry['name']}}}",
                            values[entry["reference"]])
    job: dict[str, Any] = json.loads(text)
    job["metadata"].update(name=values["${trialSpec.Name}"], namespace="kubeflow")
    return job


def test_a_substituted_trial_validates_and_runs_vaecf_train(shipped) -> None:
    values = {p["name"]: p["feasibleSpace"]["list"][-1] for p in shipped["spec"]["parameters"]}
    values["${trialSpec.Name}"] = "vaecf-tune-x7k2p9qz"
    job = substituted(shipped, values)
    crd = yaml.safe_load(CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.validate(job, schema)
    args = launcher(job)["container"]["args"]
    flags = build_parser("train").parse_args(args[args.index("vaecf") + 2:])
    assert flags.beta_cap == float(values["beta_cap"]) and flags.epochs == int(values["epochs"])
    assert flags.anneal_steps == int(values["anneal_steps"])
    assert flags.learning_rate == float(values["learning_rate"])
    assert flags.dropout == float(values["dropout"])
    assert flags.output == "s3://vaecf/tuning/vaecf-tune-x7k2p9qz/model"
    assert flags.tensorboard_dir == "s3://vaecf/tuning/vaecf-tune-x7k2p9qz/tensorboard"


def test_the_training_log_satisfies_the_collectors_default_filter(shipped) -> None:
    from vaecf.train.tracking import metrics_line

    assert "source" not in shipped["spec"]["metricsCollectorSpec"]  # the default filter
    line = metrics_line({"ndcg_at_100": 0.4123, "recall_at_20": 0.35, "recall_at_50": 0.5})
    found = {m.group(1): float(m.group(2)) for m in KATIB_DEFAULT_FILTER.finditer(line)}
    objective = shipped["spec"]["objective"]
    assert found == {objective["objectiveMetricName"]: 0.4123, "recall_at_20": 0.35,
                     "recall_at_50": 0.5}
    assert set(objective["additionalMetricNames"]) <= set(found)


def test_the_checks_catch_an_unresolved_placeholder(shipped) -> None:
    broken = copy.deepcopy(shipped)
    broken["spec"]["trialTemplate"]["trialParameters"].pop()
    with pytest.raises(AssertionError):
        test_every_trial_parameter_is_defined_and_every_parameter_used(broken)
