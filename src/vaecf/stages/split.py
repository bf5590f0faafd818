"""``vaecf split``: interactions -> train/val/test users, fold_in/holdout items (NPZ + Parquet)."""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vaecf import log
from vaecf.data.preprocess import interactions_files
from vaecf.data.split import SplitConfig, split_parquet, write_split
from vaecf.errors import VaecfError
from vaecf.io import is_s3, manifest_name, open_input, publish, read_manifest
from vaecf.io.manifest import read_remote_manifest, require_listed
from vaecf.io.publish import remote_staging
from vaecf.io.roles import Role
from vaecf.stages import location, new_parser, run_stage, seed
from vaecf.stages.preprocess import engine_flag

STAGE = "split"
PROTOCOLS = ("mission", "paper")
# Held-out users per split under the paper protocol (Liang et al. 2018, section 4.2).
PAPER_HELDOUT_USERS = {"ml-20m": 10_000, "netflix": 40_000}


@dataclass(frozen=True)
class SplitStageConfig:
    input: str
    output: str
    protocol: str
    split: SplitConfig


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(STAGE, "Split users 86/7/7 into train/val/test (or fixed held-out "
                               "counts for --protocol paper) and each held-out user's items "
                               "80/20 into fold_in/holdout.")
    location(parser, "--input", Role.INPUT, required=True, help="output of 'vaecf preprocess'")
    location(parser, "--output", Role.OUTPUT, manifest=manifest_name("dataset"), required=True,
             help="output directory or s3:// prefix")
    parser.add_argument("--seed", type=seed, default=98765, help="the split's only randomness")
    parser.add_argument("--protocol", default=None,
                        help="mission: fractions; paper: ml-20m 10,000 and netflix 40,000 "
                             "held-out users per split (other datasets: 7%%) [default: the "
                             "protocol 'vaecf preprocess' recorded, else mission]")
    parser.add_argument("--val-fraction", type=float, default=0.07, help="share of val users")
    parser.add_argument("--test-fraction", type=float, default=0.07, help="share of test users")
    parser.add_argument("--heldout-users", type=int, default=None,
                        help="users in val and in test each (overrides the fractions)")
    parser.add_argument("--holdout-fraction", type=float, default=0.2,
                        help="share of a held-out user's items in the holdout")
    engine_flag(parser)
    return parser


def heldout_users(protocol: str, dataset: str, given: int | None) -> int | None:
    """The fixed held-out count, if any: the flag, else the paper's count for ``dataset``.

    Datasets the paper did not use (and ``mission``) hold out the fractions instead.
    """
    if given is not None:
        if given < 1:
            raise VaecfError(f"--heldout-users: must be >= 1, got {given}")
        return given
    return PAPER_HELDOUT_USERS.get(dataset) if protocol == "paper" else None


def resolve_protocol(given: str | None, preprocess: dict[str, Any]) -> dict[str, str | None]:
    """The split's protocol: ``--protocol`` if given, else the one preprocess recorded.

    Returns ``protocol``, where it came from (``protocol_source``: ``--protocol``,
    ``preprocess`` or ``default``) and the preprocess protocol it overrides, for the manifest.
    """
    recorded = (preprocess.get("parameters") or {}).get("protocol")
    recorded = recorded if recorded in PROTOCOLS else None
    if given is not None:
        if recorded is not None and recorded != given:
            log.warning(f"vaecf split: warning: --protocol {given} overrides the protocol "
                        f"'{recorded}' that preprocess recorded")
        return {"protocol": given, "protocol_source": "--protocol",
                "preprocess_protocol": recorded}
    if recorded is not None:
        log.info(f"split: protocol '{recorded}', as preprocess recorded")
        return {"protocol": recorded, "protocol_source": "preprocess",
                "preprocess_protocol": recorded}
    return {"protocol": "mission", "protocol_source": "default", "preprocess_protocol": None}


def _check_flags(args: argparse.Namespace) -> None:
    if args.protocol is not None and args.protocol not in PROTOCOLS:
        raise VaecfError(f"--protocol: unknown protocol '{args.protocol}' "
                         f"(one of: {', '.join(PROTOCOLS)})")
    for flag, value in (("--val-fraction", args.val_fraction),
                        ("--test-fraction", args.test_fraction),
                        ("--holdout-fraction", args.holdout_fraction)):
        if not 0.0 < value < 1.0:
            raise VaecfError(f"{flag}: must be between 0 and 1, got {value}")
    if args.val_fraction + args.test_fraction >= 1.0:
        raise VaecfError("--val-fraction + --test-fraction: must be below 1")


def run(input_uri: str, output: str, given: str | None, args: argparse.Namespace) -> None:
    started = time.monotonic()
    # The Spark engine's tasks read an s3:// input where it lies; the driver reads the manifest.
    in_place = args.engine == "spark" and is_s3(input_uri)
    with (publish(output, manifest_name("dataset"), [input_uri]) as staging,
          nullcontext(None) if in_place else open_input(input_uri) as source):
        if source is None:
            manifest = read_remote_manifest(input_uri, "preprocess")
            where: Path | str = input_uri.rstrip("/")
        else:
            manifest = read_manifest(source, "preprocess")
            where = source
        files = interactions_files(manifest, f"{where}/preprocess_manifest.json")
        require_listed(manifest, "preprocess", where, files)
        dataset = str(manifest.get("dataset", "unknown"))
        chosen = resolve_protocol(given, manifest)
        protocol = str(chosen["protocol"])
        config = SplitStageConfig(input_uri, output, protocol, SplitConfig(
            seed=args.seed, val_fraction=args.val_fraction, test_fraction=args.test_fraction,
            heldout_users=heldout_users(protocol, dataset, args.heldout_users),
            holdout_fraction=args.holdout_fraction))
        recorded: dict[str, Any] = {
            "inputs": {"input": input_uri, "preprocess_files": manifest["files"]},
            "parameters": {**chosen, **asdict(config.split)}, "started": started}
        if args.engine == "spark":
            written = _spark(where, files, manifest["files"], staging, config.split,
                             extra={"dataset": dataset, "engine": "spark"}, **recorded)
        else:
            assert source is not None
            result = split_parquet([source / name for name in files], config.split)
            written = write_split(result, staging, dataset=dataset, **recorded)
        log.info(f"split: {written['n_users']} users, {written['n_items']:,} items "
                 f"(seed {config.split.seed})")


def _spark(source: Path | str, files: list[str], listed: dict[str, Any], staging: Path,
           config: SplitConfig, **manifest: Any) -> dict[str, Any]:
    """The Spark engine; ``source``: the interactions, a local folder or an ``s3://`` prefix
    whose files the tasks check and read in place. To an ``s3://`` output the tasks write
    the split's parts to its staging prefix (``remote_staging``)."""
    from vaecf.data.spark.session import spark_session

    with spark_session(staging) as spark:
        from vaecf.data.spark import split as engine
        from vaecf.data.spark.raw import check_files

        if isinstance(source, str):
            check_files(spark, source, manifest_name("preprocess"), listed)
            paths: list[Path | str] = [f"{source}/{name}" for name in files]
        else:
            paths = [source / name for name in files]
        return engine.split(*engine.read_interactions(spark, paths), config, staging,
                            remote_staging(staging), **manifest)


def _body(args: argparse.Namespace) -> None:
    _check_flags(args)
    run(args.input, args.output, args.protocol, args)


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, build_parser(), argv, _body)
