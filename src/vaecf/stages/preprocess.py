"""``vaecf preprocess``: raw download -> ``interactions.parquet`` of positive pairs."""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vaecf import log
from vaecf.data.datasets import Dataset, get_dataset, release_of
from vaecf.data.preprocess import (
    INTERACTIONS,
    PARTS,
    PROTOCOLS,
    FilterConfig,
    files_read,
    filter_config,
    preprocess,
    write_interactions,
)
from vaecf.data.readers import READERS, iter_raw, layout_of
from vaecf.data.readers.archive import find_data_files, is_archive, remote_data_files
from vaecf.data.readers.interactions_table import TableColumns, recorded_columns
from vaecf.errors import VaecfError
from vaecf.io import (
    is_s3,
    manifest_name,
    open_input,
    publish,
    read_manifest,
    scratch,
    write_manifest,
)
from vaecf.io.manifest import read_remote_manifest
from vaecf.io.publish import remote_scratch, remote_staging
from vaecf.io.roles import Role
from vaecf.stages import location, new_parser, run_stage

STAGE = "preprocess"
OUTPUT_FILE = INTERACTIONS


ENGINES = ("pandas", "spark")


@dataclass(frozen=True)
class PreprocessConfig:
    input: str
    output: str
    filters: FilterConfig
    engine: str = "pandas"


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(STAGE, "Read a downloaded dataset, convert it to implicit feedback, "
                               "deduplicate and filter; write interactions.parquet.")
    location(parser, "--input", Role.INPUT, required=True, help="output of 'vaecf download'")
    location(parser, "--output", Role.OUTPUT, manifest=manifest_name(STAGE), required=True,
             help="output directory or s3:// prefix")
    parser.add_argument("--protocol", default="mission",
                        help=f"threshold preset, one of: {', '.join(PROTOCOLS)} (mission: items "
                             ">= 5 users then users >= 5 items; paper: users >= 5 items only)")
    parser.add_argument("--min-rating", type=float, default=None,
                        help="a rating (MovieLens, Netflix, a table with --value-kind rating) "
                             "is positive if >= this (default 4.0, i.e. > 3.5 stars)")
    parser.add_argument("--min-user-items", type=int, default=None,
                        help="drop users with fewer items (default: from the protocol, 5)")
    parser.add_argument("--min-item-users", type=int, default=None,
                        help="drop items with fewer users (default: mission 5, paper 0 = off)")
    parser.add_argument("--k-core", action="store_true",
                        help="repeat the item and user filters until nothing changes")
    parser.add_argument("--min-plays", type=int, default=None,
                        help="Last.fm, and a table with --value-kind plays: a play count is "
                             "positive if >= this (default 1)")
    engine_flag(parser)
    return parser


def run(config: PreprocessConfig) -> None:
    started = time.monotonic()
    with publish(config.output, manifest_name(STAGE), [config.input]) as staging:
        in_place = _in_place(config)
        with (nullcontext(None) if in_place else open_input(config.input)) as raw_dir:
            if raw_dir is None:  # read once, by _in_place
                assert in_place is not None
                download = in_place
            else:
                download = read_manifest(raw_dir, "download")
            source = config.input.rstrip("/") if raw_dir is None else raw_dir
            try:
                dataset = get_dataset(download["dataset"])
                names = [record["name"] for record in download["downloads"]]
            except (KeyError, TypeError) as err:
                raise VaecfError(f"{source}/download_manifest.json: missing field {err}"
                                 ) from None
            unchecked = sorted(set(map(str, names)) - set(download["files"]))
            if unchecked:  # the SHA-256 of the listed files alone is checked
                raise VaecfError(f"{source}/download_manifest.json: downloads[].name "
                                 f"{unchecked[0]!r} is not one of its checksummed files")
            where = f"{source}/download_manifest.json"
            table = recorded_columns(download, where) if dataset.reader == "table" else None
            with scratch(staging) as extracted:
                if config.engine == "spark":
                    read, counts, written = _spark(dataset, source, names, extracted, table,
                                                   config.filters, staging / OUTPUT_FILE,
                                                   download["files"])
                else:
                    assert raw_dir is not None
                    read, counts = _pandas(dataset, raw_dir, names, extracted, table,
                                           config.filters, staging / OUTPUT_FILE)
                    written = {}
        kept = counts["output"]
        log.info(f"{dataset.name}: {kept['rows']:,} positives of {kept['users']:,} users x "
                 f"{kept['items']:,} items ({counts['duplicates']:,} duplicate pairs removed)")
        parts = {PARTS: {OUTPUT_FILE: list(written)}} if written else {}
        write_manifest(staging, STAGE, inputs={"input": config.input,
                                               "download_files": download["files"]},
                       parameters=asdict(config.filters), counts=counts, started=started,
                       extra={"dataset": dataset.name, "engine": config.engine,
                              "files_read": read,
                              "layout": layout_of(dataset.reader, read),
                              "release": release_of(read),
                              "verified_release": download.get("verified_release"),
                              **({"table": table.record()} if table else {}), **parts},
                       written={name: {"sha256": entry["sha256"], "bytes": entry["bytes"]}
                                for name, entry in written.items()})


def _in_place(config: PreprocessConfig) -> dict[str, Any] | None:
    """The download's manifest when the Spark engine's tasks read the download where it lies
    (``s3://``, plain files, checked by the tasks): nothing is copied to the driver; else
    None. An archive is still fetched and opened by the driver (its members are not byte
    ranges of an object), which puts them where a cluster's tasks read them
    (``share_files``)."""
    if config.engine != "spark" or not is_s3(config.input):
        return None
    download = read_remote_manifest(config.input, "download")
    names = [str(record.get("name", "")) for record in download.get("downloads") or []
             if isinstance(record, dict)]
    if any(is_archive(name) for name in names):
        log.info(f"{config.input}: an archive: the driver fetches and opens it")
        return None
    return download


def _pandas(dataset: Dataset, raw_dir: Path, names: list[str], extracted: Path,
            table: TableColumns | None, filters: FilterConfig, output: Path
            ) -> tuple[list[str], dict[str, Any]]:
    # Read a block at a time, keeping each block's positives only.
    result = preprocess(iter_raw(dataset.reader, raw_dir, names, extracted, table), filters)
    log.info(f"{dataset.name}: read {result.counts['raw']['rows']:,} rows from "
             f"{len(result.files)} file(s)")
    write_interactions(output, result)
    return list(result.files), result.counts


def _spark(dataset: Dataset, source: Path | str, names: list[str], extracted: Path,
           table: TableColumns | None, filters: FilterConfig, output: Path,
           listed: dict[str, Any]) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """The Spark engine; ``source``: the download, a local folder or an ``s3://`` prefix
    whose files the tasks check and read in place. Returns what the tasks wrote to the
    output's S3 staging prefix (``remote_staging``), if the output is ``s3://``."""
    from vaecf.data.spark.session import spark_session

    with spark_session(output.parent) as spark:
        from vaecf.data.spark import preprocess as engine
        from vaecf.data.spark.raw import check_files, share_files
        from vaecf.data.spark.raw import read_raw as read_frame

        found = READERS[dataset.reader]
        if isinstance(source, str):
            check_files(spark, source, manifest_name("download"), listed)
            files = remote_data_files(source, names, found.match)
        else:
            files = share_files(spark, find_data_files(source, names, found.match, extracted,
                                                       found.archives),
                                remote_scratch(output.parent))
        raw = read_frame(spark, dataset.reader, files, names, str(source), filters, table)
        log.info(f"{dataset.name}: parsed {len(files)} file(s) on Spark")
        counts, written = engine.preprocess(raw, filters, files_read(f.label for f in files),
                                            output, remote_staging(output.parent))
    return [f.label for f in files], counts, written


def engine_flag(parser: argparse.ArgumentParser) -> None:
    """``--engine``: the pandas engine (one process) or the Spark engine (a cluster)."""
    parser.add_argument("--engine", choices=ENGINES, default="pandas",
                        help="pandas: in one process's memory; spark: on Spark (the "
                             "'vaecf[spark]' extra and Java 17; local[*] unless spark-submit "
                             "or MASTER names a cluster); both write the same data")


def _body(args: argparse.Namespace) -> None:
    filters = filter_config(args.protocol, min_rating=args.min_rating,
                            min_plays=args.min_plays, min_user_items=args.min_user_items,
                            min_item_users=args.min_item_users, k_core=args.k_core)
    run(PreprocessConfig(input=args.input, output=args.output, filters=filters,
                         engine=args.engine))


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, build_parser(), argv, _body)
