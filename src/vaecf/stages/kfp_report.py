"""``python -m vaecf.stages.kfp_report``: the pipeline's report step, shown in the KFP UI.

It runs ``vaecf report`` with the flags after ``--``, then fills the step's KFP artifacts
(``vaecf.k8s.kfp_report``): the Markdown, the HTML and the evaluation's scalars.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from vaecf import log
from vaecf.errors import VaecfError
from vaecf.io.publish import read_json
from vaecf.k8s.kfp_report import metrics_output, scalar_metrics, write_executor_output
from vaecf.stages import new_parser, run_stage

STAGE = "kfp-report"


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
