"""Render the Katib Experiment (kubeflow.org/v1beta1) whose trials are the training MPIJob.

``python -m vaecf.k8s.katib --output manifests/tuning/experiment.yaml`` writes the shipped
Experiment; tests compare the file with a fresh rendering. The trial is the MPIJob that
``vaecf launch-mpijob`` would create (``manifests/mpijob.yaml`` rendered by ``render``), with
each searched ``vaecf train`` flag set from a ``${trialParameters.X}`` and every output under
``<store>/<trial name>/``. Katib's CRD carries no schema (its webhook validates), so what it
would check is checked by the tests: the metric names, enums, the placeholders.

Two things only a cluster decides, both Katib v0.19 facts: the launcher pod of a v2beta1
MPIJob carries ``training.kubeflow.org/job-role: launcher`` (Katib's own Horovod example uses
the v1 label ``mpi-job-role``, which never matches), and an MPIJob counts as done by its
``Succeeded``/``Failed`` conditions (the GJSON paths below). The objective is what the
launcher's log prints after each validated epoch, ``val ndcg_at_100=0.41...``, read by
Katib's StdOut collector with its default filter; ``max`` over epochs is the exported model.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from vaecf.k8s import render
from vaecf.tuning.space import SEARCHABLE
from vaecf.tuning.trials import OBJECTIVE, VAL_KEYS

# Katib cannot pass "no flag" (the default schedule), so annealing is searched in steps: 0 is
# the cap from the start; ML-20M at batch 500 has 234 steps per epoch, 11,700 in 50 epochs.
SPACE: dict[str, list[float | int]] = {
    "beta_cap": [0.1, 0.2, 0.3, 0.4], "anneal_steps": [0, 5000, 10000, 20000],
    "learning_rate": [0.0003, 0.001, 0.003], "dropout": [0.3, 0.5], "epochs": [50, 100]}
ADDITIONAL = [key for key in VAL_KEYS if key != OBJECTIVE]
LAUNCHER_ROLE = {"training.kubeflow.org/job-role": "launcher"}
TRIAL_NAME = "trialName"
HEADER = ("# Katib Experiment: Mult-VAE hyperparameter search, each trial the training MPIJob.\n"
          "# Rendered by `python -m vaecf.k8s.katib --output manifests/tuning/experiment.yaml`;"
          "\n# do not edit by hand. Cluster prerequisites: README, section \"Tuning\".\n")


def trial_parameter(name: str) -> str:
    """``beta_cap`` -> ``betaCap``: the ``${trialParameters.X}`` name of a hyperparameter."""
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _trial_spec(template: dict[str, Any], split_uri: str, store: str) -> dict[str, Any]:
    """The MPIJob of one trial, its searched flags and locations left as placeholders."""
    trial = f"${{trialParameters.{TRIAL_NAME}}}"
    flags = [arg for name in SPACE if name != "epochs"
             for arg in (SEARCHABLE[name][0], f"${{trialParameters.{trial_parameter(name)}}}")]
    params = render.MPIJobParams(
        name="vaecf-trial", namespace="default", run_id="katib",
        image=str(render.container(template["spec"], "Launcher")["image"]),
        split_uri=split_uri, model_uri=f"{store}/{trial}/model",
        checkpoint_uri=f"{store}/{trial}/checkpoints",
        tensorboard_uri=f"{store}/{trial}/tensorboard", train_flags=tuple(flags),
        epochs=1)  # a fixed count, the searched placeholder below
    job = render.render(template, params)
    job["metadata"].pop("name")  # Katib names the job after the trial, in its namespace
    job["metadata"].pop("namespace")
    job["metadata"]["labels"][render.RUN_ID_LABEL] = trial
    args = render.container(job["spec"], "Launcher")["args"]
    args[args.index("--epochs") + 1] = f"${{trialParameters.{trial_parameter('epochs')}}}"
    return job


def experiment(template: dict[str, Any], *, name: str = "vaecf-tune", split_uri: str = "s3://vaecf/splits/ml-20m",
               store: str = "s3://vaecf/tuning", max_trials: int = 12,
               parallel_trials: int = 3, seed: int = 98765) -> dict[str, Any]:
    """The Experiment: random search over ``SPACE``, maximising validation NDCG@100.

    It names no namespace: ``kubectl apply -n <namespace>`` puts it, its trials, and so the
    Secret and the metrics collector they need, where the user runs them."""
    parameters = [{"name": key, "parameterType": "discrete",
                   "feasibleSpace": {"list": [str(v) for v in values]}}
                  for key, values in SPACE.items()]
    trial_parameters = [{"name": TRIAL_NAME, "description": "the trial's name (its outputs' "
                         "folder)", "reference": "${trialSpec.Name}"}]
    trial_parameters += [{"name": trial_parameter(key), "reference": key,
                          "description": f"vaecf train {SEARCHABLE[key][0]}"} for key in SPACE]
    return {
        "apiVersion": "kubeflow.org/v1beta1", "kind": "Experiment",
        "metadata": {"name": name},
        "spec": {
            "objective": {"type": "maximize", "objectiveMetricName": OBJECTIVE,
                          "additionalMetricNames": ADDITIONAL,
                          "metricStrategies": [{"name": m, "value": "max"}
                                               for m in (OBJECTIVE, *ADDITIONAL)]},
            "algorithm": {"algorithmName": "random",
                          "algorithmSettings": [{"name": "random_state", "value": str(seed)}]},
            "parallelTrialCount": parallel_trials, "maxTrialCount": max_trials,
            "maxFailedTrialCount": 3,
            "metricsCollectorSpec": {"collector": {"kind": "StdOut"}},
            "parameters": parameters,
            "trialTemplate": {
                "primaryContainerName": "launcher", "primaryPodLabels": dict(LAUNCHER_ROLE),
                "successCondition": 'status.conditions.#(type=="Succeeded")#|#(status=="True")#',
                "failureCondition": 'status.conditions.#(type=="Failed")#|#(status=="True")#',
                "trialParameters": trial_parameters,
                "trialSpec": _trial_spec(template, split_uri, store)}}}


def to_yaml(document: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(document, sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vaecf.k8s.katib",
                                     description="Render the Katib Experiment of vaecf.")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--template", type=Path, default=None,
                        help="MPIJob template (default: manifests/mpijob.yaml)")
    args = parser.parse_args(argv)
    template = render.load_template(args.template or render.default_template())
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(to_yaml(experiment(template)))
    print(f"rendered {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
