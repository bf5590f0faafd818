"""``vaecf preprocess --engine spark``: the pandas engine's steps on Spark.

The raw rows come from ``vaecf.data.spark.raw`` (every layout the pandas engine reads, with
its checks and its lines for bad input). Then the same steps, counted the same way:
``raw`` -> ``implicit`` -> ``dedup`` -> ``item_filter`` -> ``user_filter`` (-> ``k_core``).

The tasks that parse apply the implicit rule (``preprocess.positive_threshold``, the pandas
engine's): the parse keeps the positives and, of the other rows, each block's distinct users
and items, which the raw counts need, never the rows. The positives and those users are
moved by range of user ids once (``frames.by_user``: packed, as the parse packed them), and
the tasks do the rest on whole users with numpy (``preprocess_tasks``): a survey pass
(deduplication, each item's users, the users of every raw row, the id-length check), then a
pass per round of the filters, the last one writing the task's sorted pairs as a part.
Between passes the driver gathers only counts and the items the item filter keeps (one row
per item, not per pair).
"""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from vaecf.data.preprocess import FilterConfig
from vaecf.data.spark.frames import arrow_type, by_user, clustered
from vaecf.data.spark.pieces import OTHER_ITEM
from vaecf.data.spark.preprocess_tasks import (
    COUNTS,
    ITEM,
    LONG_ID,
    PACKED,
    PART,
    round_schema,
    rounds,
)
from vaecf.data.spark.raw import RawFrame, task_environment
from vaecf.data.splits import save_parquet_batches
from vaecf.errors import VaecfError
from vaecf.io.readers import IDS, id_too_long, read_parquet

_IDS = ("user_id", "item_id")


def _pass(pairs: DataFrame, keys: list[int] | None, kept: np.ndarray | None,
          config: FilterConfig, schema: pa.Schema, fields: pa.Schema, uri: str | None = None,
          others: DataFrame | None = None
          ) -> tuple[DataFrame, list[Any], tuple[np.ndarray, np.ndarray]]:
    """One pass of ``preprocess_tasks.rounds`` over ``pairs``, the positives moved by user
    range (the survey, given the partitions' ``keys``) or what the survey packed: its rows
    (``schema``), persisted (the caller unpersists them); those that are counts, parts and
    refusals, collected; and ``_item_users`` of its items (and of ``others``)."""
    spark = pairs.sparkSession
    # unpersisted, not destroyed: a cached pass may be computed again (an evicted block)
    shared = spark.sparkContext.broadcast(kept) if kept is not None else None
    try:
        found = pairs.mapInArrow(partial(
            rounds, keys=keys, kept=shared, min_user_items=config.min_user_items,
            schema=schema, uri=uri, part_schema=fields,
            environment=task_environment(spark)), from_arrow_schema(schema)).persist()
        told = found.where(F.col("kind").isin(COUNTS, PART, LONG_ID)).drop("blob").collect()
        return found, told, _item_users(found, others)
    finally:
        if shared is not None:
            shared.unpersist()


def _item_users(found: DataFrame, others: DataFrame | None) -> tuple[np.ndarray, np.ndarray]:
    """Each item of a pass's pairs (its ``ITEM`` rows: an item's users in a task), and of
    ``others`` (the parse's ``OTHER_ITEM`` rows, if given), sorted, with its users summed
    over the tasks (0: an item of ``others`` alone): one aggregation, one row per item to the
    driver (the catalogue, as the kept items broadcast to the tasks)."""
    items = found.where(F.col("kind") == ITEM).select("item_id", "n")
    if others is not None:
        items = items.unionByName(others.select("item_id", F.lit(0).cast("long").alias("n")))
    table = clustered(items, "item_id").groupBy("item_id").agg(F.sum("n").alias("n")).toArrow()
    ids = table.column("item_id").to_numpy(zero_copy_only=False)
    order = np.argsort(ids, kind="stable")
    return ids[order], table.column("n").to_numpy()[order]


def _fields(pairs: DataFrame) -> list[tuple[str, pa.DataType]]:
    return [(column, arrow_type(pairs, column)) for column in _IDS]


def _summed(told: list[Any], step: str) -> dict[str, int]:
    """``{"rows", "users"}`` of ``step`` summed over the tasks' ``COUNTS`` rows."""
    total = {"rows": 0, "users": 0}
    for row in told:
        if row["kind"] == COUNTS:
            for key, value in json.loads(row["text"])[step].items():
                total[key] = total.get(key, 0) + value
    return total


def _kept_items(items: tuple[np.ndarray, np.ndarray], minimum: int) -> np.ndarray | None:
    """The ids of ``_item_users``' items with ``minimum`` users or more, sorted (None: no
    item filter)."""
    ids, users = items
    return ids[users >= minimum] if minimum > 0 else None


def preprocess(raw: RawFrame, config: FilterConfig, source: str, output: Path,
               remote: str | None = None) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Positives of ``raw`` after dedup and filtering, written as ``interactions.parquet``
    sorted by (user_id, item_id) at ``output`` (the driver assembling the tasks' parts), or,
    given ``remote`` (the output's S3 staging prefix), as the tasks' parts
    ``interactions/part-*.parquet`` there; ``source`` names the files read in errors
    (``files_read``). Returns the counts of every step and the parts written to
    ``remote`` (``{name: {"sha256", "bytes", "rows", "row_groups"}}``; empty for a local
    output)."""
    try:
        if raw.positives == 0:
            raise VaecfError(f"no positives: no {raw.kind} passes the threshold (--min-rating "
                             f"{config.min_rating:g}, --min-plays {config.min_plays})")
        fields = pa.schema(_fields(raw.rows))
        schema = round_schema(fields[0].type, fields[1].type)
        held, told, items = _pass(*by_user(raw.rows, raw.positives), None, config, schema,
                                  fields, others=raw.rows.where(F.col("kind") == OTHER_ITEM))
    finally:
        raw.cached.unpersist()
    dedup = _summed(told, "dedup")
    raw_items, n_items = len(items[0]), int(np.count_nonzero(items[1]))
    counts: dict[str, Any] = {
        **raw.counts,
        "raw": {"rows": raw.read, "users": _summed(told, "raw")["users"], "items": raw_items},
        "implicit": {"rows": raw.positives, "users": dedup["users"], "items": n_items},
        "duplicates": raw.positives - dedup["rows"],
        "dedup": {"rows": dedup["rows"], "users": dedup["users"], "items": n_items}}
    try:
        return _filtered(held, told, items, config, counts, source, output, remote, schema,
                         fields)
    finally:
        held.unpersist()


def _filtered(held: DataFrame, told: list[Any], items: tuple[np.ndarray, np.ndarray],
              config: FilterConfig, counts: dict[str, Any], source: str, output: Path,
              remote: str | None, schema: pa.Schema, fields: pa.Schema
              ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The filters' rounds over the surveyed pairs ``held`` (the survey's rows; ``items``
    its ``_item_users``), the last one writing them."""
    pairs, found = held.where(F.col("kind") == PACKED).select("blob"), held
    for row in told:
        if row["kind"] == LONG_ID:
            column = "user_id" if row["user_id"] is not None else "item_id"
            text = str(row[column])
            raise id_too_long(source, column, text, len(text.encode("utf-8", "surrogatepass")))
    uri = remote if remote is not None else str(output.parent / f".{output.name}.parts")
    rounds_done, before, n_items = 0, counts["dedup"]["rows"], counts["dedup"]["items"]
    while True:
        rounds_done += 1
        kept = _kept_items(items, config.min_item_users)
        if found is not held:
            found.unpersist()
        found, told, items = _pass(pairs, None, kept, config, schema, fields,
                                   None if config.k_core else uri)
        after: dict[str, int] = _summed(told, "users")
        after["items"] = len(items[0])
        if rounds_done == 1:
            filtered = _summed(told, "items")
            counts["item_filter"] = {**filtered, "items": n_items if kept is None else len(kept)}
            counts["user_filter"] = after
        if not config.k_core or after["rows"] in (before, 0):
            break
        before, n_items = after["rows"], after["items"]
    if config.k_core:
        counts["k_core"] = {**after, "rounds": rounds_done}
        if after["rows"]:
            found.unpersist()
            found, told, items = _pass(pairs, None, kept, config, schema, fields, uri)
    found.unpersist()
    if after["rows"] == 0:
        raise VaecfError(
            f"every user was filtered out: none of {counts['dedup']['users']:,} users keeps "
            f"--min-user-items {config.min_user_items} items after dropping items with fewer "
            f"than --min-item-users {config.min_item_users} users; lower the thresholds")
    counts["output"] = dict(after)
    parts = {entry["name"]: entry for entry in sorted(
        (json.loads(row["text"]) for row in told if row["kind"] == PART),
        key=lambda entry: entry["name"])}
    if remote is not None:
        return counts, parts
    _assemble(output, Path(uri), parts, fields)
    return counts, {}


def _assemble(path: Path, folder: Path, parts: dict[str, dict[str, Any]],
              schema: pa.Schema) -> None:
    """``interactions.parquet`` at ``path`` from the parts in ``folder`` (then removed), in
    order, read by the bounded reader."""
    columns = dict.fromkeys(_IDS, IDS)
    batches = (batch for name, entry in parts.items() for batch in read_parquet(
        folder / name, columns, group_rows=[rows for _, rows in entry["row_groups"]]
    ).select(list(columns)).to_batches())
    for _ in save_parquet_batches(path, schema, batches):
        pass
    shutil.rmtree(folder, ignore_errors=True)
