"""DataFrame helpers of the Spark engine: ranges of users, partition sizes, the parts the
tasks wrote, types."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from vaecf.data.spark.pieces import PACKED, RANGED, SAMPLE, ranged

# Rows of pairs per partition of a frame partitioned by user. Spark's 200 shuffle partitions
# cost each task its own hash maps and pages: at 9.9M positives a pass over 200 cached
# partitions took several times the CPU of the same pass over 5 (notes/i38speed.md). A task
# of either stage holds its partition's pairs in memory (``split_tasks``, ``preprocess_tasks``).
ROWS_PER_PARTITION = 2_000_000


def partitions(frame: DataFrame, rows: int) -> int:
    """Partitions for ``rows`` rows of pairs: about ``ROWS_PER_PARTITION`` each, at least one
    per core."""
    return max(frame.sparkSession.sparkContext.defaultParallelism, -(-rows // ROWS_PER_PARTITION))


def by_user(frame: DataFrame, rows: int) -> tuple[DataFrame, list[int]]:
    """The rows a reader packed in ``frame`` (``pieces.packed_users``: ``rows`` of them;
    ``frame`` persisted, read twice), moved so that each partition holds a range of users,
    every row of them, the ranges in user id order (numbers, or text by code point) from
    one partition to the next: what ``repartitionByRange`` does, with the rows moved
    packed, a few values per task and range, not converted one by one by the JVM. The
    ranges are cut at quantiles of the readers' sample of users (as Spark's range
    partitioner cuts at those of its sample); each range's rows go to its partition by the
    key ``partition_keys`` found for it. Returns the moved rows (``pieces.RANGED``; a
    task reads its range with ``pieces.gathered``) and the keys."""
    count = partitions(frame, rows)
    sample = frame.where(F.col("kind") == SAMPLE).select("user_id").toArrow().column(0)
    users = np.sort(sample.to_numpy(zero_copy_only=False))
    bounds = users[np.arange(1, count) * len(users) // count] if len(users) else users[:0]
    keys = partition_keys(frame.sparkSession, count)
    moved = frame.where(F.col("kind") == PACKED).select("blob").mapInArrow(
        partial(ranged, bounds=bounds, keys=keys), from_arrow_schema(RANGED))
    return moved.repartition(count, "key"), keys


def partition_keys(spark: SparkSession, count: int) -> list[int]:
    """For each partition ``j`` of ``count``, a long that Spark's hash partitioning
    (``repartition(count, column)``: ``pmod(hash(column), count)``, Murmur3) sends to
    partition ``j``: the least such, found by Spark's own ``hash``."""
    keys: dict[int, int] = {}
    start, step = 0, 16 * count
    while len(keys) < count:
        for row in spark.range(start, start + step).select(
                "id", F.pmod(F.hash("id"), F.lit(count)).alias("j")).collect():
            keys.setdefault(int(row["j"]), int(row["id"]))
        start += step
    return [keys[j] for j in range(count)]


def clustered(frame: DataFrame, *columns: str) -> DataFrame:
    """``frame`` hash-partitioned by ``columns`` into a partition per core, for an aggregation
    by them (or by more columns) that then needs no other shuffle. The engine's aggregations
    are small (a row per item or key bucket and partition); under Spark's 200 shuffle
    partitions each of their map tasks writes 200 blocks, which cost more CPU than the rows
    (preprocess at 99.1M: 4 CPU-s of the JVM's task threads per aggregation of 1M rows)."""
    return frame.repartition(frame.sparkSession.sparkContext.defaultParallelism, *columns)


def parts_found(rows: list[Any]) -> dict[str, dict[str, Any]]:
    """``{part name: {"sha256", "bytes", "rows", "row_groups"}}`` of the ``PARTS`` rows the
    tasks returned, in name order."""
    return {row["name"]: {"sha256": row["sha256"], "bytes": int(row["bytes"]),
                          "rows": int(row["rows"]), "row_groups": json.loads(row["row_groups"])}
            for row in sorted(rows, key=lambda row: row["name"])}


def arrow_type(frame: DataFrame, column: str) -> pa.DataType:
    """The Arrow type of an id column, as pandas writes it (text as ``string``)."""
    from pyspark.sql.pandas.types import to_arrow_type

    kind = to_arrow_type(frame.schema[column].dataType)
    return pa.string() if pa.types.is_large_string(kind) else kind
