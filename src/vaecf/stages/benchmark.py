"""``vaecf benchmark``: training speed over precisions x world sizes x batch sizes.

Writes ``benchmark.json`` (fingerprint, split shape, compute bound, every run, min and median
per configuration), each run's console output and train log under ``runs/``, and
``benchmark_manifest.json``. ``vaecf report --benchmark`` turns it into the speed section.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict

from vaecf import log
from vaecf.errors import VaecfError
from vaecf.io import manifest_name, publish, write_manifest
from vaecf.io.roles import Role
from vaecf.stages import location, new_parser, run_stage, seed
from vaecf.train.benchmark import DEFAULT_HIDDEN, DEFAULT_LATENT, TRAINING_OPTIONS
from vaecf.train.scaling import BASE_LEARNING_RATE, LR_RULES

STAGE = "benchmark"
PRECISIONS = ("fp32", "mixed_float16", "mixed_bfloat16")
# ML-20M after the paper's filtering: 136,677 users x 20,108 items.
ML20M_USERS, ML20M_ITEMS = 136_677, 20_108


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(STAGE, "Measure 'vaecf train' speed over a matrix of configurations "
                               "(world sizes > 1 through horovodrun --gloo on this host).")
    location(parser, "--split", Role.INPUT, help="split directory or s3:// prefix (default: "
             "generate an ML-20M-shaped synthetic split)")
    location(parser, "--output", Role.OUTPUT, manifest=manifest_name(STAGE), required=True,
             help="output directory or s3:// prefix")
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS,
                        default=["fp32", "mixed_bfloat16"], help="training precisions")
    parser.add_argument("--world-sizes", nargs="+", type=_positive, default=[1, 2],
                        help="Horovod process counts (above 1: horovodrun -np N --gloo)")
    parser.add_argument("--batch-sizes", nargs="+", type=_positive, default=[500],
                        help="global batch sizes (users per step, all ranks together)")
    work = parser.add_mutually_exclusive_group()
    work.add_argument("--steps", type=_positive, default=50,
                      help="measured steps per run, after a warm-up epoch of as many steps")
    work.add_argument("--epochs", type=_positive, default=None,
                      help="measured full epochs per run, after one warm-up epoch")
    parser.add_argument("--repeats", type=_positive, default=1,
                        help="runs per configuration; min and median are reported")
    parser.add_argument("--target-ndcg", type=float, default=None,
                        help="also time each run to this validation NDCG@100 (validates "
                             "every epoch; use with --epochs)")
    parser.add_argument("--synthetic-users", type=_positive, default=ML20M_USERS,
                        help="users of the generated split when no --split is given")
    parser.add_argument("--synthetic-items", type=_positive, default=ML20M_ITEMS,
                        help="items of the generated split when no --split is given")
    parser.add_argument("--seed", type=seed, default=0,
                        help="seed of the generated split and of every training run")
    parser.add_argument("--xla", action="store_true",
                        help="train every run with --xla (the whole step compiled)")
    parser.add_argument("--lr-scaling", nargs="+", choices=LR_RULES, default=["none"],
                        help="learning-rate rules, each run with each: vaecf train's "
                             f"{BASE_LEARNING_RATE:g} at 500 users per step, scaled to the global "
                             "batch as none, sqrt or linear")
    parser.add_argument("--hidden", type=_positive, default=DEFAULT_HIDDEN,
                        help="every run's hidden layer width (train --hidden)")
    parser.add_argument("--latent", type=_positive, default=DEFAULT_LATENT,
                        help="every run's latent dimension (train --latent)")
    parser.add_argument("--training-options", nargs="+", choices=list(TRAINING_OPTIONS),
                        default=[], metavar="OPTION", help="every run with these of RecVAE's "
                        "options and ImplicitSLIM's step, at their published settings: "
                        + ", ".join(f"{name} ({' '.join(flags)})"
                                    for name, flags in TRAINING_OPTIONS.items()))
    parser.add_argument("--item-layouts", nargs="+", choices=("whole", "sharded"),
                        default=["whole"], help="item layers whole on every rank, and/or "
                        "sharded over the ranks (train --shard-items; world sizes >= 2)")
    return parser


def main(argv: list[str] | None = None) -> int:
    def body(args: argparse.Namespace) -> None:
        from vaecf.train.benchmark import BenchmarkConfig, run_benchmark

        started = time.monotonic()
        config = BenchmarkConfig(
            split=args.split, precisions=tuple(args.precisions),
            world_sizes=tuple(args.world_sizes), batch_sizes=tuple(args.batch_sizes),
            steps=None if args.epochs else args.steps, epochs=args.epochs,
            repeats=args.repeats, target_ndcg=args.target_ndcg,
            synthetic_users=args.synthetic_users, synthetic_items=args.synthetic_items,
            seed=args.seed, xla=args.xla, lr_scalings=tuple(dict.fromkeys(args.lr_scaling)),
            shard_items=tuple(dict.fromkeys(layout == "sharded"
                                            for layout in args.item_layouts)),
            hidden=args.hidden, latent=args.latent,
            training_options=tuple(dict.fromkeys(args.training_options)))
        with publish(args.output, manifest_name(STAGE), [args.split]) as staging:
            result = run_benchmark(config, staging)
            if not any(run["status"] == "ok" for run in result["runs"]):
                first = result["runs"][0]
                raise VaecfError(f"every benchmark run failed; first: {first['name']}: "
                                 f"{first['error']}")
            (staging / "benchmark.json").write_text(json.dumps(result, indent=2) + "\n")
            write_manifest(staging, STAGE, inputs={"split": args.split},
                           parameters={k: v for k, v in asdict(config).items() if k != "split"},
                           counts={"runs": len(result["runs"]),
                                   "runs_ok": sum(r["status"] == "ok" for r in result["runs"])},
                           started=started)
        log.info(f"benchmark: wrote benchmark.json to {args.output}")

    return run_stage(STAGE, build_parser(), argv, body)
