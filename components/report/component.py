"""``vaecf report`` as a KFP container component, with outputs the KFP UI shows.

The report itself is a directory (``report.md``, ``report.html``, ``report.json``, manifest);
``vaecf.stages.kfp_report`` runs ``vaecf report`` with the flags after ``--`` and then copies the
Markdown and HTML into their typed artifacts and logs the scalar metrics on the ``metrics``
artifact (system.Metrics) through KFP's executor output, which is what the run page and the
run-compare page read.
"""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Metrics, Model, Output

from components.images import DEFAULT

EXECUTOR_INPUT = "{{$}}"  # KFP's executor input JSON (it names the executor output file)


def kfp_report_spec(report: Output[Artifact], markdown: Output[Markdown], html: Output[HTML],
                    metrics: Output[Metrics], *report_args: object) -> dsl.ContainerSpec:
    """``vaecf report --output <report> <report_args>`` through ``vaecf.stages.kfp_report``,
    which then fills the Markdown, HTML and metrics artifacts (the run report's and the
    sweep's)."""
    return dsl.ContainerSpec(
        image=DEFAULT.launcher,  # has matplotlib for the plots; no TensorFlow needed
        command=["python", "-m", "vaecf.stages.kfp_report"],
        args=["--executor-input", EXECUTOR_INPUT, "--markdown", markdown.path,
              "--html", html.path, "--metrics-artifact", "metrics",
              "--metrics-path", metrics.path, "--", "--output", report.path, *report_args],
    )


@dsl.container_component
def report(split: Input[Dataset], model: Input[Model], evaluation: Input[Artifact],
           report: Output[Artifact], markdown: Output[Markdown], html: Output[HTML],
           metrics: Output[Metrics]) -> dsl.ContainerSpec:
    """The run report, its Markdown and HTML views, and the metrics as KFP scalars.

    Args:
      split: output of ``split`` (its manifest describes the data).
      model: output of ``train`` (train log and manifest).
      evaluation: output of ``evaluate`` (``metrics.json``).
      report: the whole report directory.
      markdown: ``report.md``.
      html: ``report.html`` (self-contained, plots embedded).
      metrics: recall_at_20, recall_at_50, ndcg_at_100 (mean and stderr), users evaluated.
    """
    return kfp_report_spec(
        report, markdown, html, metrics,
        "--train-log", dsl.ConcatPlaceholder([model.path, "/train_log.jsonl"]),
        "--metrics", dsl.ConcatPlaceholder([evaluation.path, "/metrics.json"]),
        "--manifests", split.path, model.path, evaluation.path)
