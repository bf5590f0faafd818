"""``vaecf split --engine spark``: the split rule of ``vaecf.data.split`` on Spark DataFrames.

- users ordered by (user key, id text) (``split_keys``): the first ``n_val`` are val, the
  next ``n_test`` test, the rest train (``heldout_counts``, as the pandas engine);
- the item universe is the items of training users; val/test pairs outside it are dropped,
  and held-out users left without items are dropped (both counted);
- each held-out user's items ordered by (pair key, item id text): the first
  ``floor(holdout_fraction * n)`` form the holdout, the rest the fold_in;
- ``user_idx``: train users, then val, then test, by user id within each split;
  ``item_idx``: item ids in sorted order.

Ranks come from ``with_rank`` (sorted range partitions, no single-partition window). To a
local output the driver receives the sorted parts one partition at a time and assembles each
NPZ; to an ``s3://`` output the tasks write each table's sorted parts there themselves and
the driver writes the manifest alone (``write_parts``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from vaecf.data.spark.frames import (
    arrow_type,
    hashed_by_user,
    id_key,
    pair_key,
    partitions,
    sorted_batches,
    sorted_parts,
    with_rank,
)
from vaecf.data.spark.pieces import code_runs
from vaecf.data.spark.raw import read_parquet_ids
from vaecf.data.split import SplitConfig, heldout_counts, user_offsets, write_split_manifest
from vaecf.data.split_files import part_entries
from vaecf.data.splits import (
    PAIRS_SCHEMA,
    PART_FILES,
    ROW_GROUPS,
    SPLITS,
    STREAM_GROUP_ROWS,
    matrix_names,
    row_group_rows,
    save_parquet_batches,
    write_part,
)

_TRAIN, _VAL, _TEST = (SPLITS.index(s) for s in SPLITS)


def read_interactions(spark: SparkSession, paths: list[Path | str]) -> tuple[DataFrame, int]:
    """``interactions.parquet``'s (user_id, item_id), read as pandas reads it (the bounded
    Parquet reader, in tasks of row groups; a path is a name, never a pattern): the file, or
    its parts, local or ``s3://`` objects read in place by the tasks; and its rows (from the
    footers)."""
    return read_parquet_ids(spark, paths, ["user_id", "item_id"])


def _assign_users(users: DataFrame, config: SplitConfig) -> tuple[DataFrame, int]:
    """(user_id, user_key, split code) of every user of ``users`` (one row per user), and
    the number of users."""
    keyed = users.select("user_id", id_key(config.seed, "user_id").alias("user_key"))
    ranked = with_rank(keyed, ["user_key", F.col("user_id").cast("string")], "rank")
    n_users = ranked.count()
    n_val, n_test = heldout_counts(n_users, config)
    split = (F.when(F.col("rank") < n_val, _VAL)
             .when(F.col("rank") < n_val + n_test, _TEST).otherwise(_TRAIN))
    return ranked.select("user_id", "user_key", split.alias("split")), n_users


def _parts(pairs: DataFrame, config: SplitConfig) -> DataFrame:
    """Each pair's part code (index into ``matrix_names()``) from the held-out rule; ``pairs``
    hashed by user: the held-out users' windows sort in their partitions, no shuffle."""
    by_user = Window.partitionBy("user_id")
    position = F.row_number().over(by_user.orderBy(
        "pair_key", F.col("item_id").cast("string"))) - 1
    holdout = position < F.floor(F.lit(config.holdout_fraction) * F.count(F.lit(1)).over(by_user))
    heldout = pair_key(pairs.where(F.col("split") != _TRAIN), "user_key", "item_key", "pair_key"
                       ).withColumn("part", 2 * F.col("split") - 1 + holdout.cast("int"))
    train = pairs.where(F.col("split") == _TRAIN).withColumn("part", F.lit(0))
    columns = ["user_idx", "item_idx", "split", "part"]
    return train.select(*columns).unionByName(heldout.select(*columns))


def split(read: DataFrame, rows: int, config: SplitConfig
          ) -> tuple[DataFrame, DataFrame, DataFrame, dict[str, Any]]:
    """Split positive (user_id, item_id) pairs (no duplicates; ``rows`` of them), as the
    pandas engine does. The pairs are read once, by the shuffle that hashes them by user
    (``rows`` comes from the files' footers, not a pass).

    Returns:
      users (user_idx, user_id, split name), items (item_idx, item_id), pairs (user_idx,
      item_idx, split code, part code), and the counts the pandas engine records.
    """
    pairs = hashed_by_user(read, rows).persist()
    # in the pairs' partitions: a cached table of Spark's 200 shuffle partitions costs
    # every later pass 200 tasks (most of a 9.9M split's CPU, notes/i38speed.md)
    per_user = pairs.groupBy("user_id").agg(F.count(F.lit(1)).alias("_n")).persist()
    try:
        return _split(pairs, per_user, rows, config)
    finally:
        pairs.unpersist()
        per_user.unpersist()


def _split(pairs: DataFrame, per_user: DataFrame, n_pairs: int, config: SplitConfig
           ) -> tuple[DataFrame, DataFrame, DataFrame, dict[str, Any]]:
    """The split of ``pairs`` (``n_pairs``), hashed by user and persisted, whose rows per
    user are ``per_user`` (user_id, _n). Every per-user table joins them
    hashed (``shuffle_hash``: only the table moves), the items' table broadcast when Spark
    finds it small; counts come from per-user tables (hash aggregates in the partitions);
    only the placed pairs are materialized, for the writes that read them part by part."""
    users, n_users = _assign_users(per_user.select("user_id"), config)
    with_split = pairs.join(users.hint("shuffle_hash"), "user_id")
    items = with_rank(with_split.where(F.col("split") == _TRAIN).select("item_id").distinct(),
                      ["item_id"], "item_idx")
    items = items.withColumn("item_key", id_key(config.seed, "item_id")).coalesce(
        partitions(pairs, n_pairs)).persist()
    kept = with_split.join(items, "item_id")
    kept_per_user = kept.groupBy("user_id", "split").agg(F.count(F.lit(1)).alias("_n")).persist()
    kept_users = with_rank(kept_per_user.select("user_id", "split"), ["split", "user_id"],
                           "user_idx").localCheckpoint()
    n_kept = int(kept_per_user.agg(F.sum("_n")).first()[0] or 0)  # type: ignore[index]
    counts: dict[str, Any] = {"pairs_outside_item_universe": n_pairs - n_kept}
    counts["heldout_users_without_items"] = n_users - kept_users.count()
    placed = _parts(kept.join(kept_users.select("user_id", "user_idx").hint("shuffle_hash"),
                              "user_id"), config).localCheckpoint()
    kept_per_user.unpersist()
    per_split: dict[int, int] = dict(kept_users.groupBy("split").count().collect())
    holdouts = placed.where((F.col("part") % 2 == 0) & (F.col("split") != _TRAIN))
    with_holdout: dict[int, int] = dict(
        holdouts.groupBy("split").agg(F.count_distinct("user_idx")).collect())
    for code, name in enumerate(SPLITS[1:], start=1):
        counts[f"{name}_users_without_holdout"] = int(
            per_split.get(code, 0) - with_holdout.get(code, 0))
    names = F.element_at(F.array(*[F.lit(s) for s in SPLITS]), F.col("split") + 1)
    user_index = kept_users.select(F.col("user_idx"), "user_id", names.alias("split"))
    return user_index, items.select("item_idx", "item_id"), placed, counts


_BY_PART = ["part", "user_idx", "item_idx"]  # every matrix's pairs in one sort, in order


def write(directory: Path, users: DataFrame, items: DataFrame, pairs: DataFrame,
          counts: dict[str, Any], remote: str | None = None, **manifest: Any) -> dict[str, Any]:
    """The split's files from the Spark split: the pandas engine's files, the pairs of every
    matrix streamed to the driver in one sort by (part, user_idx, item_idx), the driver
    writing them in ``directory``; or, given ``remote`` (the output's S3 staging prefix),
    each table as sorted Parquet parts written there by the tasks (``write_parts``), the
    driver writing the manifest alone."""
    n_users = {name: 0 for name in SPLITS} | dict(users.groupBy("split").count().collect())
    n_items = items.count()
    per_part: dict[int, int] = dict(pairs.groupBy("part").count().collect())
    train_groups = row_group_rows(per_part.get(0, 0))
    if remote is not None:
        return write_parts(directory, remote, users, items, pairs, counts, n_users, n_items,
                           train_groups, **manifest)
    offsets = user_offsets(n_users)
    pair_counts: dict[str, int] = {}
    row_groups: list[list[int]] = []
    runs = code_runs(sorted_batches(pairs.select(*_BY_PART), _BY_PART))
    run = next(runs, None)
    for code, part in enumerate(matrix_names()):
        name = part.split("_")[0]
        batches = run[1] if run is not None and run[0] == code else iter(())
        shape, offset = (n_users[name], n_items), offsets[name]
        if part == "train":  # in row groups a rank can read alone: its share
            pair_counts[part], row_groups = write_part(directory, part, batches, shape, offset,
                                                       train_groups)
        else:
            pair_counts[part], _ = write_part(directory, part, batches, shape, offset)
        if run is not None and run[0] == code:
            run = next(runs, None)
    _stream(directory / "user_index.parquet", users, "user_idx", _index_fields(users, "user"))
    _stream(directory / "item_index.parquet", items, "item_idx", _index_fields(items, "item"))
    extra = manifest.pop("extra") | {ROW_GROUPS: row_groups}
    return write_split_manifest(directory, counts=counts, pairs=pair_counts, n_users=n_users,
                                n_items=n_items, extra=extra, **manifest)


def write_parts(directory: Path, remote: str, users: DataFrame, items: DataFrame,
                pairs: DataFrame, counts: dict[str, Any], n_users: dict[str, int],
                n_items: int, train_groups: int, **manifest: Any) -> dict[str, Any]:
    """Each matrix's pairs and each index as sorted Parquet parts ``<table>/part-<n>.parquet``
    in ``remote``, written by the tasks (``sorted_parts``: the matrices in one sort by
    (part, user_idx, item_idx); training's in row groups of ``train_groups`` rows, which a
    rank reads alone: its share); the driver receives one row per part and writes the
    manifest, which lists them (``parts``) with their checksums. No NPZ: ``load_split``
    builds the matrices from the parts. The driver's memory does not grow with the pairs."""
    tables = {part: train_groups if part == "train" else STREAM_GROUP_ROWS
              for part in matrix_names()}
    found = sorted_parts(pairs.select(*_BY_PART), _BY_PART, remote, tables, PAIRS_SCHEMA,
                         by_code=True)
    for kind, frame in (("user", users), ("item", items)):
        found |= sorted_parts(frame, [f"{kind}_idx"], remote, {f"{kind}_index": STREAM_GROUP_ROWS},
                              pa.schema(_index_fields(frame, kind)))
    layout = {f"{table}.parquet": part_entries(parts) for table, parts in found.items()}
    written = {name: {"sha256": e["sha256"], "bytes": e["bytes"]}
               for parts in found.values() for name, e in parts.items()}
    pair_counts = {table: sum(e["rows"] for e in found[table].values())
                   for table in matrix_names()}
    extra = manifest.pop("extra") | {PART_FILES: layout}
    return write_split_manifest(directory, counts=counts, pairs=pair_counts, n_users=n_users,
                                n_items=n_items, extra=extra, written=written, **manifest)


def _index_fields(frame: DataFrame, kind: str) -> list[tuple[str, Any]]:
    """The columns of ``user_index.parquet`` (``kind`` user) or ``item_index.parquet``."""
    fields = [(f"{kind}_idx", pa.int32()), (f"{kind}_id", arrow_type(frame, f"{kind}_id"))]
    return [*fields, ("split", pa.string())] if kind == "user" else fields


def _stream(path: Path, frame: DataFrame, order: str, fields: list[tuple[str, Any]]) -> None:
    for _ in save_parquet_batches(path, pa.schema(fields), sorted_batches(frame, [order])):
        pass
