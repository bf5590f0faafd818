"""``python -m vaecf.k8s.kfp_report``: the pipeline's report step, shown in the KFP UI.

It runs ``vaecf report`` with the flags after ``--``, then fills the step's typed artifacts:
``report.md`` into the Markdown artifact, ``report.html`` into the HTML artifact, and the
evaluation's scalars onto the ``system.Metrics`` artifact. KFP v2 reads an artifact's metrics
from its metadata, which a container reports in the executor output file named by the executor
input (``{{$}}``), the same channel ``Metrics.log_metric`` uses in Python components; that is
what the run page's metrics view and the run-compare page show.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from vaecf import log
from vaecf.errors import VaecfError
from vaecf.io.publish import read_json
from vaecf.stages import new_parser, run_stage

STAGE = "kfp-report"
METRIC_KEYS = ("recall_at_20", "recall_at_50", "ndcg_at_100")


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(STAGE, "Run 'vaecf report' (flags after --) and fill the KFP "
                               "Markdown, HTML and Metrics artifacts.")
    parser.add_argument("--executor-input", required=True, help="KFP executor input JSON")
    parser.add_argument("--markdown", type=Path, required=True, help="Markdown artifact path")
    parser.add_argument("--html", type=Path, required=True, help="HTML artifact path")
    parser.add_argument("--metrics-artifact", default="metrics",
                        help="name of the system.Metrics output artifact")
    parser.add_argument("--metrics-path", type=Path, required=True,
                        help="that artifact's file: the same scalars as JSON, for people")
    parser.add_argument("report_args", nargs="*", help="flags of 'vaecf report' after --")
    return parser


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """Flat name -> number of ``metrics.json`` (vaecf evaluate): means, stderrs, user counts,
    and each baseline's means prefixed by its name (``popularity_ndcg_at_100``)."""
    scalars: dict[str, float] = {}
    for key in METRIC_KEYS:
        if key in metrics:
            scalars[key] = float(metrics[key]["mean"])
            scalars[f"{key}_stderr"] = float(metrics[key]["stderr"])
    for count in ("users_evaluated", "users_skipped"):
        if count in metrics:
            scalars[count] = float(metrics[count])
    for baseline, values in sorted((metrics.get("baselines") or {}).items()):
        for key in METRIC_KEYS:
            if key in values:
                scalars[f"{baseline}_{key}"] = float(values[key]["mean"])
    return scalars


def metrics_output(executor_input: dict[str, Any], artifact: str
                   ) -> tuple[dict[str, Any], Path]:
    """The output ``artifact``'s entry and the executor output file, from the executor input."""
    try:
        outputs = executor_input["outputs"]
        entry = dict(outputs["artifacts"][artifact]["artifacts"][0])
        return entry, Path(outputs["outputFile"])
    except (KeyError, IndexError, TypeError) as err:
        raise VaecfError(f"--executor-input: no output artifact {artifact!r} or outputFile "
                         f"({err})") from err


def write_executor_output(path: Path, artifact: str, entry: dict[str, Any],
                          scalars: dict[str, float]) -> None:
    """Record ``scalars`` as the metadata of output ``artifact`` in KFP's executor output."""
    entry = {**entry, "metadata": {**(entry.get("metadata") or {}), **scalars}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"artifacts": {artifact: {"artifacts": [entry]}}}, indent=2))


def run(args: argparse.Namespace) -> None:
    from vaecf.cli import build_parser as stage_parser
    from vaecf.cli import main as vaecf_main

    try:
        executor_input = json.loads(args.executor_input)
    except ValueError as err:
        raise VaecfError(f"--executor-input: not JSON ({err})") from err
    entry, output_file = metrics_output(executor_input, args.metrics_artifact)
    report = stage_parser("report").parse_args(args.report_args)
    if vaecf_main(["report", *args.report_args]) != 0:
        raise VaecfError("'vaecf report' failed (its error is above)")
    for source, target in (("report.md", args.markdown), ("report.html", args.html)):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(report.output) / source, target)
    scalars = scalar_metrics(read_json(report.metrics) if report.metrics else {})
    write_executor_output(output_file, args.metrics_artifact, entry, scalars)
    args.metrics_path.parent.mkdir(parents=True, exist_ok=True)
    args.metrics_path.write_text(json.dumps(scalars, indent=2) + "\n")
    log.info(f"{STAGE}: logged {len(scalars)} metrics: "
             + ", ".join(f"{k}={v:.4g}" for k, v in scalars.items()))


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, build_parser(), argv, run)


if __name__ == "__main__":
    sys.exit(main())
