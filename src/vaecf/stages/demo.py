"""``vaecf demo``: every stage of the pipeline on this machine, with no cluster.

The stages exchange data exactly as on a cluster: each writes a published directory (or s3://
prefix, with ``--output s3://bucket/prefix``) with its manifest, and the next reads it. Training
runs under ``horovodrun -np N --gloo`` (N = ``--workers``) like the MPIJob's ranks.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from vaecf.errors import VaecfError
from vaecf.io import open_input
from vaecf.io.readers import read_json
from vaecf.io.roles import Role
from vaecf.log import info
from vaecf.stages import location, new_parser, run_stage, seed

STAGE = "demo"
# What the demo writes in its --output: each stage's output, and the checkpoints.
PARTS = frozenset({"raw", "interactions", "split", "model", "checkpoints", "metrics", "report"})
PRECISIONS = ("auto", "fp32", "mixed_float16", "mixed_bfloat16")


@dataclass(frozen=True)
class DemoConfig:
    dataset: str
    source: str | None
    output: str
    users: int
    items: int
    epochs: int
    batch_size: int | None
    workers: int
    precision: str
    protocol: str
    seed: int


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(STAGE, "Run download -> preprocess -> split -> train -> evaluate -> "
                               "report on this machine.")
    parser.add_argument("--dataset", default="synthetic", help="dataset name (see download)")
    location(parser, "--source", Role.SOURCE, help="where to download the dataset from "
             "(default: its public URL; synthetic needs none)")
    location(parser, "--output", Role.WORKSPACE, default="demo-output", holds=PARTS,
             help="directory or s3:// prefix holding every stage's output (never '.', the "
             "working directory or a parent of it)")
    parser.add_argument("--users", type=int, default=5000, help="synthetic users")
    parser.add_argument("--items", type=int, default=2000, help="synthetic items")
    parser.add_argument("--epochs", type=int, default=20, help="training epochs")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="global batch size [default: train's, 500 or a smaller split's "
                             "training users]")
    parser.add_argument("--workers", type=int, default=2,
                        help="Horovod processes (horovodrun -np N --gloo); 1 runs in-process")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="auto: mixed_bfloat16 where the CPU has bfloat16 units, else fp32")
    parser.add_argument("--protocol", choices=("mission", "paper"), default="mission")
    parser.add_argument("--seed", type=seed, default=98765)
    return parser


def cpu_precision() -> str:
    """``mixed_bfloat16`` when the CPU computes in bfloat16 natively (AVX512-BF16 or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "fp32"
    return "mixed_bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "fp32"


def stage_commands(config: DemoConfig) -> list[list[str]]:
    """The ``vaecf`` command line of each stage, in order."""
    out = config.output.rstrip("/")
    raw, interactions, split = f"{out}/raw", f"{out}/interactions", f"{out}/split"
    model, metrics = f"{out}/model", f"{out}/metrics"
    precision = cpu_precision() if config.precision == "auto" else config.precision
    download = ["download", "--dataset", config.dataset, "--output", raw,
                "--seed", str(config.seed)]
    if config.source:
        download += ["--source", config.source]
    if config.dataset == "synthetic":
        download += ["--synthetic-users", str(config.users),
                     "--synthetic-items", str(config.items)]
    return [
        download,
        ["preprocess", "--input", raw, "--output", interactions, "--protocol", config.protocol],
        ["split", "--input", interactions, "--output", split, "--seed", str(config.seed),
         "--protocol", config.protocol],
        ["train", "--split", split, "--output", model, "--checkpoint-dir",
         f"{out}/checkpoints", "--epochs", str(config.epochs),
         *(["--batch-size", str(config.batch_size)] if config.batch_size else []),
         "--precision", precision, "--seed", str(config.seed),
         "--expect-world-size", str(config.workers)],
        ["evaluate", "--split", split, "--model", model, "--output", metrics,
         "--baselines", "popularity", "ease"],
        ["report", "--output", f"{out}/report", "--train-log", f"{model}/train_log.jsonl",
         "--metrics", f"{metrics}/metrics.json", "--manifests", raw, interactions, split,
         model, metrics],
    ]


def _run(command: list[str], workers: int) -> None:
    from vaecf.cli import main

    info(f"demo: vaecf {' '.join(command)}")
    if command[0] == "train" and workers > 1:
        horovodrun = shutil.which("horovodrun", path=str(Path(sys.executable).parent))
        if horovodrun is None:
            raise VaecfError("horovodrun not found next to this Python: run 'make install'")
        code = subprocess.run([horovodrun, "-np", str(workers), "--gloo", sys.executable,
                               "-m", "vaecf.cli", *command]).returncode
    else:
        code = main(command)
    if code != 0:
        raise VaecfError(f"stage '{command[0]}' failed (exit {code}); see its message above")


def run(config: DemoConfig) -> None:
    for command in stage_commands(config):
        _run(command, config.workers)
    with open_input(f"{config.output.rstrip('/')}/metrics") as metrics_dir:
        metrics = read_json(metrics_dir / "metrics.json")
    info("demo: done. Test-set accuracy (mean +- standard error):")
    for name, values in [("Mult-VAE", metrics), *metrics.get("baselines", {}).items()]:
        info(f"  {name:<11} " + "  ".join(
            f"{key} {values[key]['mean']:.4f} +- {values[key]['stderr']:.4f}"
            for key in ("recall_at_20", "recall_at_50", "ndcg_at_100")))
    info(f"demo: report at {config.output.rstrip('/')}/report/report.html (and report.md)")


def _body(args: argparse.Namespace) -> None:
    if args.workers < 1 or args.epochs < 1 or args.users < 10 or args.items < 10:
        raise VaecfError("--workers and --epochs must be >= 1, --users and --items >= 10")
    run(DemoConfig(dataset=args.dataset, source=args.source, output=args.output,
                   users=args.users, items=args.items, epochs=args.epochs,
                   batch_size=args.batch_size, workers=args.workers,
                   precision=args.precision, protocol=args.protocol, seed=args.seed))


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, build_parser(), argv, _body)
