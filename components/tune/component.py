"""The sweep's trial validation and fan-in steps (``vaecf evaluate`` and ``vaecf tune``).

A trial is the pipeline's own train step (``components.train``) with the trial's
hyperparameters, then ``validate_trial``; ``select_best`` receives every trial's model and
validation metrics through ``dsl.Collected`` and runs ``vaecf tune`` in its fan-in mode, which
reads the lists of artifacts from KFP's executor input (a container cannot name a list's
paths in its arguments).
"""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Metrics, Model, Output

from components.images import DEFAULT
from components.report.component import EXECUTOR_INPUT, kfp_report_spec


@dsl.container_component
def validate_trial(split: Input[Dataset], model: Input[Model],
                   evaluation: Output[Artifact]) -> dsl.ContainerSpec:
    """A trial's model on the validation users (no baselines: they do not vary by trial).

    Args:
      split: output of ``split``.
      model: the trial's train step output.
      evaluation: ``metrics.json`` (subset ``val``) and its manifest.
    """
    return dsl.ContainerSpec(
        image=DEFAULT.train,
        command=["vaecf", "evaluate"],
        args=["--split", split.path, "--model", model.path, "--output", evaluation.path,
              "--subset", "val"],
    )


@dsl.container_component
def select_best(split: Input[Dataset], models: Input[list[Model]],
                evaluations: Input[list[Artifact]],
                tuning: Output[Artifact]) -> dsl.ContainerSpec:
    """Pick the best trial by validation NDCG@100 and evaluate it once on the test users.

    Args:
      split: output of ``split``.
      models: every trial's model (``dsl.Collected``).
      evaluations: every trial's ``validate_trial`` output, in the same order.
      tuning: ``trials.jsonl``, ``test/metrics.json`` (the best trial and the baselines on
        the test users) and ``tune_manifest.json``.
    """
    return dsl.ContainerSpec(
        image=DEFAULT.train,
        command=["vaecf", "tune"],
        args=["--split", split.path, "--output", tuning.path,
              "--executor-input", EXECUTOR_INPUT],
    )


@dsl.container_component
def tuning_report(split: Input[Dataset], tuning: Input[Artifact], report: Output[Artifact],
                  markdown: Output[Markdown], html: Output[HTML],
                  metrics: Output[Metrics]) -> dsl.ContainerSpec:
    """The sweep's report: every trial (table and plot), the best one on the test users.

    Args:
      split: output of ``split`` (its manifest describes the data).
      tuning: output of ``select_best``.
      report: the whole report directory; markdown, html: its two views.
      metrics: the best trial's test metrics and the baselines', as KFP scalars.
    """
    return kfp_report_spec(
        report, markdown, html, metrics,
        "--trials", dsl.ConcatPlaceholder([tuning.path, "/trials.jsonl"]),
        "--metrics", dsl.ConcatPlaceholder([tuning.path, "/test/metrics.json"]),
        "--manifests", split.path, tuning.path)
