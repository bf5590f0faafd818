"""``vaecf split --engine spark``: the split rule of ``vaecf.data.split`` on Spark.

The pairs are moved by range of user ids once (``frames.by_user``); each task packs its
pairs (Arrow IPC, a few values per partition) into a persisted frame, with one row per user
and its key (``split_tasks.pack``). Every later pass hands a task its partition's pairs
whole, in user id order from one partition to the next, and the task places its users with
the pandas engine's own code (``split_tasks``). Between the tasks' two passes the driver
gathers only what no task can know alone, never a pair:

- of the users' keys (``split_keys``' SHA-256, computed once per user by the tasks), two:
  the first test user and the first training user (``Bounds``), found by counting the users
  of each key bucket and ordering the users of two buckets; every task classifies its
  users against them;
- the item universe (the items of training users, one row per item): it is held by the
  driver and broadcast to the tasks, so its size is the catalogue's, not the input's;
- how many users of each split each partition keeps (a few numbers per partition), from
  which each partition's users get their ``user_idx``: train users, then val, then test, by
  user id within each split, as the pandas engine numbers them.

The second pass writes each table as sorted Parquet parts, to the output's ``s3://``
staging prefix, listed by the manifest with their checksums (no NPZ); to a local output,
to a folder of its staging area, from which the driver assembles the pandas engine's files
(NPZ and Parquet), holding one matrix's item column at a time.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from vaecf.data.spark.frames import arrow_type, by_user, clustered, parts_found
from vaecf.data.spark.pieces import PARTS
from vaecf.data.spark.raw import read_parquet_ids, task_environment
from vaecf.data.spark.split_tasks import (
    COUNTS,
    ITEM,
    KEPT,
    PACKED,
    TRAIN_PAIRS,
    UNSURE,
    USER,
    Bounds,
    Universe,
    item_table,
    pack,
    pack_schema,
    place,
    survey,
    survey_schema,
    write_items,
)
from vaecf.data.split import (
    SplitConfig,
    heldout_counts,
    item_order,
    user_offsets,
    write_split_manifest,
)
from vaecf.data.split_files import part_entries
from vaecf.data.split_keys import id_text
from vaecf.data.splits import (
    PART_FILES,
    ROW_GROUPS,
    SPLITS,
    STREAM_GROUP_ROWS,
    matrix_names,
    row_group_rows,
    save_parquet,
    save_parquet_batches,
    write_part,
)
from vaecf.io.readers import IDS, INDEX, read_parquet


def read_interactions(spark: SparkSession, paths: list[Path | str]) -> tuple[DataFrame, int]:
    """``interactions.parquet``'s (user_id, item_id), read as pandas reads it (the bounded
    Parquet reader, in tasks of row groups; a path is a name, never a pattern): the file, or
    its parts, local or ``s3://`` objects read in place by the tasks; and its rows (from the
    footers)."""
    return read_parquet_ids(spark, paths, ["user_id", "item_id"])


def split(read: DataFrame, rows: int, config: SplitConfig, directory: Path,
          remote: str | None = None, **manifest: Any) -> dict[str, Any]:
    """Split positive (user_id, item_id) pairs (no duplicates; ``rows`` of them) as the
    pandas engine does and write the split: in ``directory`` (the pandas engine's files),
    or, given ``remote`` (the output's S3 staging prefix), as parts there, ``directory``
    receiving the manifest alone. Returns the manifest."""
    schema = pack_schema(arrow_type(read, "user_id"))
    read = read.persist()  # read twice: its sample of users, then its pairs moved
    try:
        moved, keys = by_user(read, rows)
        held = moved.mapInArrow(partial(pack, seed=config.seed, keys=keys, schema=schema),
                                from_arrow_schema(schema)).persist()
        try:
            return _split(held, read, config, directory, remote, **manifest)
        finally:
            held.unpersist()
    finally:
        read.unpersist()


# The users' keys are SHA-256 bits, uniform whatever the ids: their top bits cut them into
# 2**16 buckets of about n_users / 65,536 users each, in key order.
_BUCKET_BITS = 16


def _bounds(held: DataFrame, config: SplitConfig) -> tuple[Bounds, int]:
    """The users' ``Bounds`` and their number, from the users ``pack`` found (each once: a
    user's pairs are in one partition): the users of each key bucket counted (one row per
    bucket to the driver), then only the users of the two buckets holding the bounds' ranks
    fetched and ordered by (key, id text)."""
    keyed = held.where(F.col("kind") == USER)
    bucket = F.shiftright("key", 64 - _BUCKET_BITS)  # arithmetic: in key order
    buckets = clustered(keyed.select(bucket.alias("bucket")), "bucket")
    sizes = sorted((int(row[0]), int(row[1]))
                   for row in buckets.groupBy("bucket").count().collect())
    n_users = sum(n for _, n in sizes)
    n_val, n_test = heldout_counts(n_users, config)
    starts = np.cumsum([0] + [n for _, n in sizes])
    wanted = []  # (bucket, position in it) of the first test user and the first train user
    for rank in (n_val, n_val + n_test):
        at = int(np.searchsorted(starts, rank, side="right")) - 1
        wanted.append((sizes[at][0], rank - int(starts[at])))
    held_users: dict[int, list[tuple[int, str]]] = {}
    for row in keyed.where(bucket.isin([b for b, _ in wanted])).select(
            bucket.alias("bucket"), "key", "user_id").collect():
        held_users.setdefault(int(row[0]), []).append((int(row[1]), id_text(row[2])))
    for users in held_users.values():
        users.sort()  # (key, id text): Python orders text by code point, as Spark does
    test, train = (held_users[b][position] for b, position in wanted)
    return Bounds(test=test, train=train), n_users


def _split(held: DataFrame, read: DataFrame, config: SplitConfig, directory: Path,
           remote: str | None, **manifest: Any) -> dict[str, Any]:
    """The split of the pairs ``held`` (``pack``'s rows, persisted), ``read``'s columns."""
    spark = held.sparkSession
    bounds, n_users = _bounds(held, config)
    pairs = held.where(F.col("kind") == PACKED).select("blob")
    schema = survey_schema(arrow_type(read, "user_id"), arrow_type(read, "item_id"))
    found = pairs.mapInArrow(partial(survey, seed=config.seed, bounds=bounds, schema=schema),
                             from_arrow_schema(schema)).persist()
    try:
        items = clustered(found.where(F.col("kind") == ITEM).select("item_id"), "item_id"
                          ).distinct()
        ids = np.sort(items.toArrow().column(0).to_numpy(zero_copy_only=False))
        kept = np.zeros((pairs.rdd.getNumPartitions(), len(SPLITS)), np.int64)
        for row in found.where(F.col("kind") == KEPT).select("partition", "split", "n").collect():
            kept[row[0], row[1]] += row[2]
        unsure = found.where(F.col("kind") == UNSURE).join(items, "item_id", "left_semi")
        resolved = (clustered(unsure.select("partition", "split", "user_id"), "partition",
                              "split").distinct().groupBy("partition", "split").count())
        for row in resolved.collect():
            kept[row[0], row[1]] += row[2]
        total = found.where(F.col("kind") == TRAIN_PAIRS).agg(F.sum("n")).first()
        assert total is not None  # an aggregate without grouping has one row
        train_pairs = int(total[0] or 0)
    finally:
        found.unpersist()
    n_split = dict(zip(SPLITS, kept.sum(axis=0).tolist(), strict=True))
    offsets = np.array([user_offsets(n_split)[name] for name in SPLITS])
    firsts = offsets + np.cumsum(kept, axis=0) - kept
    universe = spark.sparkContext.broadcast(Universe(ids, *item_order(config.seed, ids)))
    group_rows = {name: STREAM_GROUP_ROWS for name in [*matrix_names(), "user_index"]}
    group_rows["train"] = row_group_rows(train_pairs)
    fields = {kind: _index_fields(read, kind) for kind in ("user", "item")}
    uri = remote if remote is not None else str(directory / "_parts")
    try:
        items_written = (_item_parts(spark, universe, remote, pa.schema(fields["item"]))
                         if remote is not None else {})
        placed = pairs.mapInArrow(partial(
            place, seed=config.seed, bounds=bounds, universe=universe,
            firsts={p: row.tolist() for p, row in enumerate(firsts)},
            holdout_fraction=config.holdout_fraction, uri=uri, group_rows=group_rows,
            index_schema=pa.schema(fields["user"]), environment=task_environment(spark)),
            from_arrow_schema(PARTS)).collect()
    finally:
        universe.destroy()
    counts: dict[str, Any] = {
        "pairs_outside_item_universe": 0, "heldout_users_without_items": n_users - int(kept.sum()),
        **{f"{name}_users_without_holdout": 0 for name in SPLITS[1:]}}
    for row in placed:
        if row["name"] == COUNTS:
            told = json.loads(row["row_groups"])
            counts["pairs_outside_item_universe"] += told["outside"]
            for name, count in zip(SPLITS[1:], told["without_holdout"], strict=True):
                counts[f"{name}_users_without_holdout"] += count
    tables = _tables([row for row in placed if row["name"] != COUNTS])
    if remote is not None:
        tables["item_index"] = items_written
        return _manifest_of_parts(directory, tables, counts, n_split, len(ids), **manifest)
    return _assemble(directory, Path(uri), tables, ids, counts, n_split, fields,
                     group_rows["train"], **manifest)


def _tables(rows: list[Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{table: {part name: entry}}`` of the ``PARTS`` rows the tasks returned, every
    matrix and ``user_index`` (empty if none of its rows exist), each table's parts in key
    order (a partition's user_index is a part per split: train users come first)."""
    tables: dict[str, dict[str, dict[str, Any]]] = {
        name: {} for name in [*matrix_names(), "user_index"]}
    found = parts_found(rows)
    for name in sorted(found, key=lambda name: (found[name]["row_groups"][0][0], name)):
        tables[name.partition("/")[0]][name] = found[name]
    return tables


def _manifest_of_parts(directory: Path, tables: dict[str, dict[str, dict[str, Any]]],
                       counts: dict[str, Any], n_users: dict[str, int], n_items: int,
                       **manifest: Any) -> dict[str, Any]:
    """The manifest of a split written as parts: it lists them (``parts``) with their
    checksums; no NPZ: ``load_split`` builds the matrices from the parts."""
    layout = {f"{table}.parquet": part_entries(parts) for table, parts in tables.items()}
    written = {name: {"sha256": e["sha256"], "bytes": e["bytes"]}
               for parts in tables.values() for name, e in parts.items()}
    pair_counts = {table: sum(e["rows"] for e in tables[table].values())
                   for table in matrix_names()}
    extra = manifest.pop("extra") | {PART_FILES: layout}
    return write_split_manifest(directory, counts=counts, pairs=pair_counts, n_users=n_users,
                                n_items=n_items, extra=extra, written=written, **manifest)


def _item_parts(spark: SparkSession, universe: Any, uri: str,
                schema: pa.Schema) -> dict[str, dict[str, Any]]:
    """``item_index`` as one part, written by a task from the broadcast universe."""
    written = spark.range(1, numPartitions=1).mapInArrow(partial(
        write_items, universe=universe, uri=uri, schema=schema,
        environment=task_environment(spark)), from_arrow_schema(PARTS)).collect()
    return parts_found(written)


def _read_parts(folder: Path, parts: dict[str, dict[str, Any]],
                columns: dict[str, str]) -> Iterator[pa.RecordBatch]:
    """The rows of a table's parts in ``folder``, in order, by the bounded reader."""
    for name, entry in parts.items():
        yield from read_parquet(folder / name, columns, group_rows=[
            rows for _, rows in entry["row_groups"]]).select(list(columns)).to_batches()


def _assemble(directory: Path, folder: Path, tables: dict[str, dict[str, dict[str, Any]]],
              ids: np.ndarray, counts: dict[str, Any], n_users: dict[str, int],
              fields: dict[str, list[tuple[str, Any]]], train_groups: int,
              **manifest: Any) -> dict[str, Any]:
    """The pandas engine's files in ``directory`` from the parts in ``folder`` (then
    removed): each matrix's NPZ and Parquet (``write_part``), the indexes, the manifest."""
    offsets = user_offsets(n_users)
    pair_counts: dict[str, int] = {}
    row_groups: list[list[int]] = []
    for part in matrix_names():
        name = part.split("_")[0]
        batches = _read_parts(folder, tables[part], _PAIRS)
        shape = (n_users[name], len(ids))
        if part == "train":  # in row groups a rank can read alone: its share
            pair_counts[part], row_groups = write_part(directory, part, batches, shape,
                                                       offsets[name], train_groups)
        else:
            pair_counts[part], _ = write_part(directory, part, batches, shape, offsets[name])
    users = _read_parts(folder, tables["user_index"], _USERS)
    for _ in save_parquet_batches(directory / "user_index.parquet", pa.schema(fields["user"]),
                                  users):
        pass
    save_parquet(directory / "item_index.parquet", item_table(ids, pa.schema(fields["item"])))
    shutil.rmtree(folder, ignore_errors=True)
    extra = manifest.pop("extra") | {ROW_GROUPS: row_groups}
    return write_split_manifest(directory, counts=counts, pairs=pair_counts, n_users=n_users,
                                n_items=len(ids), extra=extra, **manifest)


_PAIRS = {"user_idx": INDEX, "item_idx": INDEX}
_USERS = {"user_idx": INDEX, "user_id": IDS, "split": IDS}


def _index_fields(frame: DataFrame, kind: str) -> list[tuple[str, Any]]:
    """The columns of ``user_index.parquet`` (``kind`` user) or ``item_index.parquet``."""
    fields = [(f"{kind}_idx", pa.int32()), (f"{kind}_id", arrow_type(frame, f"{kind}_id"))]
    return [*fields, ("split", pa.string())] if kind == "user" else fields
