"""``vaecf benchmark-serve``: latency and throughput of ``vaecf serve`` under load.

Starts ``vaecf serve`` on loopback with the given model, runs closed-loop HTTP clients for
each (clients, users per request) pair and writes ``serve_benchmark.json`` (p50/p99 latency,
users/s and errors per scenario, the server's memory before and after, the in-process rate of
the same signature, and each floor with its measured value) and ``benchmark-serve_manifest.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict

from vaecf import log
from vaecf.io import manifest_name, publish, write_manifest
from vaecf.io.roles import Role
from vaecf.stages import location, new_parser, run_stage, seed
from vaecf.stages.serve import positive

STAGE = "benchmark-serve"


def duration(text: str) -> float:
    value = float(text)
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"expected seconds in (0, 3600], got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(STAGE, "Load-test 'vaecf serve' on this machine (loopback only).")
    location(parser, "--model", Role.INPUT, required=True, help="'vaecf train' output (dir or s3://)")
    location(parser, "--output", Role.OUTPUT, manifest=manifest_name(STAGE), required=True,
             help="output directory or s3:// prefix")
    parser.add_argument("--clients", nargs="+", type=positive, default=[1, 8, 32],
                        help="concurrent closed-loop clients")
    parser.add_argument("--users-per-request", nargs="+", type=positive, default=[1, 32])
    parser.add_argument("--seconds", type=duration, default=60.0, help="per scenario")
    parser.add_argument("--items-per-user", type=positive, default=73,
                        help="random known items per user of a request")
    parser.add_argument("--seed", type=seed, default=0)
    return parser


def _body(args: argparse.Namespace) -> None:
    from vaecf.serve.benchmark import ServeBenchmarkConfig, run_serve_benchmark

    started = time.monotonic()
    config = ServeBenchmarkConfig(model=args.model, clients=tuple(args.clients),
                                  users_per_request=tuple(args.users_per_request),
                                  seconds=args.seconds, items_per_user=args.items_per_user,
                                  seed=args.seed)
    with publish(args.output, manifest_name(STAGE), [args.model]) as staging:
        result = run_serve_benchmark(config, staging)
        (staging / "serve_benchmark.json").write_text(json.dumps(result, indent=2) + "\n")
        write_manifest(staging, STAGE, inputs={"model": args.model},
                       parameters={k: v for k, v in asdict(config).items() if k != "model"},
                       counts={"runs": len(result["runs"]),
                               "errors": sum(r["errors"] for r in result["runs"])},
                       started=started)
    for name, check in result["floors"].items():
        log.info(f"floor {name}: {'met' if check['met'] else 'NOT met'} "
                 f"({ {k: v for k, v in check.items() if k != 'met'} })")
    log.info(f"benchmark-serve: wrote serve_benchmark.json to {args.output}")


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, build_parser(), argv, _body)
