"""``vaecf report``: the run report from any subset of train log, metrics, benchmark, manifests.

Writes ``report.md``, ``report.html`` (self-contained: plots embedded, no external URLs),
``report.json`` and ``report_manifest.json``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from vaecf import log
from vaecf.io import manifest_name, publish, write_manifest
from vaecf.stages import new_parser, run_stage

STAGE = "report"


@dataclass(frozen=True)
class ReportConfig:
    output: str
    train_log: str | None
    metrics: str | None
    benchmark: str | None
    manifests: tuple[str, ...]
    reference: str | None
    trials: str | None = None


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(STAGE, "Write the run report (Markdown, self-contained HTML, JSON): "
                               "the verdict first, then accuracy, training, speed, provenance.")
    parser.add_argument("--output", required=True, help="output directory or s3:// prefix")
    parser.add_argument("--train-log", help="train_log.jsonl of 'vaecf train' (file or s3://)")
    parser.add_argument("--metrics", help="metrics.json of 'vaecf evaluate' (file or s3://)")
    parser.add_argument("--benchmark", help="benchmark.json of 'vaecf benchmark'")
    parser.add_argument("--manifests", nargs="+", default=[], metavar="DIR",
                        help="stage output directories (or *_manifest.json files) whose "
                             "manifests describe the data, configuration and versions")
    parser.add_argument("--reference", help="benchmark.json of a previous run to compare "
                                            "speed against")
    parser.add_argument("--trials", help="trials.jsonl of 'vaecf tune': every trial, as a "
                                         "table and a plot")
    return parser


def run(config: ReportConfig) -> None:
    from vaecf.report import build
    from vaecf.report.inputs import load_inputs

    started = time.monotonic()
    inputs = load_inputs(train_log=config.train_log, metrics=config.metrics,
                         benchmark=config.benchmark, manifests=list(config.manifests),
                         reference=config.reference, trials=config.trials)
    sources = [config.train_log, config.metrics, config.benchmark, config.reference,
               config.trials, *config.manifests]
    with publish(config.output, manifest_name(STAGE), sources) as staging:
        data = build.write(staging, inputs)
        write_manifest(staging, STAGE, inputs=inputs.sources,
                       parameters={"reference": config.reference},
                       counts={"sections": sorted(k for k in data if k != "inputs")},
                       started=started)
    log.info(f"report: wrote {', '.join(build.FILES)} to {config.output}")


def main(argv: list[str] | None = None) -> int:
    def body(args: argparse.Namespace) -> None:
        run(ReportConfig(output=args.output, train_log=args.train_log, metrics=args.metrics,
                         benchmark=args.benchmark, manifests=tuple(args.manifests),
                         reference=args.reference, trials=args.trials))

    return run_stage(STAGE, build_parser(), argv, body)
