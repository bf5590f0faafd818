"""``vaecf download``: fetch a dataset's raw files, verify them, publish with a manifest."""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass

from vaecf import log
from vaecf.data.datasets import DATASETS, get_dataset
from vaecf.data.download import (
    SyntheticSize,
    check_local_source,
    download_dataset,
    inspect_download,
    verified_release,
)
from vaecf.data.readers import TableColumns
from vaecf.data.readers.interactions_table import VALUE_KINDS, table_columns
from vaecf.errors import VaecfError
from vaecf.io import manifest_name, publish, write_manifest
from vaecf.io.roles import Role
from vaecf.stages import location, new_parser, run_stage, seed

STAGE = "download"


@dataclass(frozen=True)
class DownloadConfig:
    dataset: str
    source: str | None
    output: str
    seed: int
    synthetic_users: int
    synthetic_items: int
    table: TableColumns | None = None


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(STAGE, "Fetch a dataset's raw files (https, s3://, file://), verify "
                               "published checksums, check that they hold the dataset's data "
                               "files and write download_manifest.json.")
    parser.add_argument("--dataset", required=True,
                        help=f"dataset name, one of: {', '.join(DATASETS)}")
    location(parser, "--source", Role.SOURCE, help="where to fetch from instead of the public URL: "
                                         "https://, s3://, file:// or a path (a file, a local "
                                         "directory or an s3:// prefix ending in '/', whose "
                                         "data files and archives are taken, subfolders "
                                         "too); required for movielens, netflix and table")
    location(parser, "--output", Role.OUTPUT, manifest=manifest_name(STAGE), required=True,
             help="output directory or s3:// prefix")
    parser.add_argument("--seed", type=seed, default=98765, help="seed of the synthetic data")
    parser.add_argument("--synthetic-users", type=int, default=5000,
                        help="users of the synthetic dataset")
    parser.add_argument("--synthetic-items", type=int, default=2000,
                        help="items of the synthetic dataset")
    table = parser.add_argument_group(
        "table (your own interactions: Parquet or CSV files, one row per interaction)")
    table.add_argument("--user-column", help="table: the column of user ids (read as text)")
    table.add_argument("--item-column", help="table: the column of item ids (read as text)")
    table.add_argument("--value-column",
                       help="table: the column of a rating or play count; without it every row "
                            "is a positive")
    table.add_argument("--value-kind",
                       help=f"table: what --value-column holds, one of: {', '.join(VALUE_KINDS)} "
                            "(a rating is positive if >= preprocess --min-rating, a play count "
                            "if >= --min-plays)")
    return parser


def run(config: DownloadConfig) -> None:
    dataset = get_dataset(config.dataset)
    if dataset.name == "synthetic" and config.source:
        raise VaecfError("--source: the synthetic dataset is generated, not downloaded")
    if (dataset.reader == "table") != (config.table is not None):
        raise VaecfError(f"dataset {dataset.name}: the table columns are "
                         f"{'required' if config.table is None else 'only for dataset table'}")
    started = time.monotonic()
    size = SyntheticSize(config.synthetic_users, config.synthetic_items, config.seed)
    check_local_source(dataset, config.source, config.output, config.table)
    with publish(config.output, manifest_name(STAGE), [config.source]) as staging:
        records = download_dataset(dataset, config.source, staging, synthetic=size)
        where = config.source or ", ".join(f.url for f in dataset.files) or dataset.name
        contents = inspect_download(dataset, staging, [r["name"] for r in records], where,
                                    config.table)
        files, verified = contents["data_files"], verified_release(dataset, records)
        proof = f", GroupLens {verified}: published MD5 matched" if verified else ""
        log.info(f"{dataset.name}: {files[0] if len(files) == 1 else f'{len(files)} files'} "
                 f"({contents['layout']}{proof})")
        parameters = {"dataset": dataset.name, "source": config.source}
        if dataset.name == "synthetic":
            parameters.update(asdict(size))
        table = config.table.record() if config.table else {}
        parameters.update(table)
        write_manifest(staging, STAGE, inputs={"source": config.source}, parameters=parameters,
                       counts={"files": len(records),
                               "bytes": sum(r["bytes"] for r in records)},
                       started=started,
                       extra={"dataset": dataset.name, "reader": dataset.reader,
                              "downloads": records, **contents,
                              "verified_release": verified,
                              **({"table": table} if table else {})})


_TABLE_FLAGS = ("user_column", "item_column", "value_column", "value_kind")


def _table(args: argparse.Namespace) -> TableColumns | None:
    """The table's columns for ``--dataset table``; the flags are refused for another."""
    if args.dataset == "table":
        return table_columns(args.user_column, args.item_column, args.value_column,
                             args.value_kind)
    given = next((name for name in _TABLE_FLAGS if getattr(args, name) is not None), None)
    if given:
        raise VaecfError(f"--{given.replace('_', '-')}: only for --dataset table")
    return None


def _body(args: argparse.Namespace) -> None:
    run(DownloadConfig(dataset=args.dataset, source=args.source, output=args.output,
                       seed=args.seed, synthetic_users=args.synthetic_users,
                       synthetic_items=args.synthetic_items, table=_table(args)))


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, build_parser(), argv, _body)
