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
from vaecf.io.roles import Role
from vaecf.stages import location, new_parser, run_stage

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
    location(parser, "--output", Role.OUTPUT, manifest=manifest_name(STAGE), required=True,
             help="output directory or s3:// prefix")
    location(parser, "--train-log", Role.INPUT_FILE,
             help="train_log.jsonl of 'vaecf train' (file or s3://)")
    location(parser, "--metrics", Role.INPUT_FILE,
             help="metrics.json of 'vaecf evaluate' (file or s3://)")
    location(parser, "--benchmark", Role.INPUT_FILE, help="benchmark.json of 'vaecf benchmark'")
    location(parser, "--manifests", Role.INPUT_ANY, nargs="+", default=[], metavar="DIR",
             help="stage output directories (or *_manifest.json files) whose manifests "
             "describe the data, configuration and versions")
    location(parser, "--reference", Role.INPUT_FILE,
             help="benchmark.json of a previous run to compare speed against")
    location(parser, "--trials", Role.INPUT_FILE,
             help="trials.jsonl of 'vaecf tune': every trial, as a table and a plot")
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
