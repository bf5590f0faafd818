"""``vaecf preprocess --engine spark``: the pandas engine's steps on Spark DataFrames.

The raw rows come from ``vaecf.data.spark.raw`` (every layout the pandas engine reads, with
its checks and its lines for bad input). Then the same steps, counted the same way:
``raw`` -> ``implicit`` -> ``dedup`` -> ``item_filter`` -> ``user_filter`` (-> ``k_core``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from vaecf.data.preprocess import INTERACTIONS_PARTS, FilterConfig
from vaecf.data.spark.frames import arrow_type, sorted_batches, sorted_parts, step_counts
from vaecf.data.spark.raw import RawFrame
from vaecf.data.splits import save_parquet_batches
from vaecf.errors import VaecfError
from vaecf.io.readers import MAX_ID_BYTES, id_too_long


def _keep_frequent(frame: DataFrame, column: str, minimum: int) -> DataFrame:
    """Rows whose ``column`` value occurs at least ``minimum`` times (``keep_frequent``)."""
    size = F.count(F.lit(1)).over(Window.partitionBy(column))
    return frame.withColumn("_n", size).where(F.col("_n") >= minimum).drop("_n")


def _filter(pairs: DataFrame, rows: int, config: FilterConfig, counts: dict[str, Any]
            ) -> tuple[DataFrame, dict[str, int]]:
    """Items first, then users; repeated until stable with ``k_core`` (as the pandas engine).
    ``rows``: the rows of ``pairs``. Returns the pairs kept and their counts; every count is
    taken once (a step's counts give the next round its rows)."""
    rounds = 0
    while True:
        rounds += 1
        before = rows
        if config.min_item_users > 0:
            pairs = _keep_frequent(pairs, "item_id", config.min_item_users)
        if rounds == 1:
            pairs = pairs.localCheckpoint()
            counts["item_filter"] = step_counts(pairs)
        pairs = _keep_frequent(pairs, "user_id", config.min_user_items).localCheckpoint()
        if rounds == 1:
            counts["user_filter"] = step_counts(pairs)
            rows = counts["user_filter"]["rows"]
        else:
            rows = pairs.count()
        if not config.k_core or rows in (before, 0):
            break
    kept = counts["user_filter"] if rounds == 1 else step_counts(pairs)
    if config.k_core:
        counts["k_core"] = {**kept, "rounds": rounds}
    return pairs, kept


def _check_ids(pairs: DataFrame, source: str) -> None:
    """The pandas engine's id limit (``vaecf.io.readers.check_ids``), in one pass."""
    longest = pairs.agg(*(F.max(F.octet_length(F.col(c).cast("string"))).alias(c)
                          for c in ("user_id", "item_id"))).first()
    assert longest is not None  # an aggregate without grouping has one row
    for column in ("user_id", "item_id"):
        if (longest[column] or 0) > MAX_ID_BYTES:
            text = F.col(column).cast("string")
            row = pairs.where(F.octet_length(text) > MAX_ID_BYTES).select(text.alias("id")).first()
            assert row is not None
            raise id_too_long(source, column, row["id"], len(row["id"].encode()))


def _positive(kind: str, config: FilterConfig) -> Column:
    """Which raw rows are positives under the dataset's rule (``positive_mask``)."""
    if kind == "rating":
        return F.col("value") >= config.min_rating
    if kind == "plays":
        return F.col("value") >= config.min_plays
    return F.lit(True)


def preprocess(raw: RawFrame, config: FilterConfig, source: str = "the input"
               ) -> tuple[DataFrame, dict[str, Any]]:
    """Positives of ``raw`` after dedup and filtering, and the counts of every step;
    ``source`` names the files read in errors (``files_read``)."""
    try:
        counts: dict[str, Any] = {**raw.counts, "raw": step_counts(raw.rows)}
        implicit = raw.rows.where(_positive(raw.kind, config)).select("user_id", "item_id")
        counts["implicit"] = step_counts(implicit)
        if counts["implicit"]["rows"] == 0:
            raise VaecfError(f"no positives: no {raw.kind} passes the threshold (--min-rating "
                             f"{config.min_rating:g}, --min-plays {config.min_plays})")
        dedup = implicit.distinct().localCheckpoint()
    finally:
        raw.cached.unpersist()
    _check_ids(dedup, source)
    distinct = step_counts(dedup)
    counts["duplicates"] = counts["implicit"]["rows"] - distinct["rows"]
    counts["dedup"] = distinct
    kept, output = _filter(dedup, distinct["rows"], config, counts)
    if output["rows"] == 0:
        raise VaecfError(
            f"every user was filtered out: none of {counts['dedup']['users']:,} users keeps "
            f"--min-user-items {config.min_user_items} items after dropping items with fewer "
            f"than --min-item-users {config.min_item_users} users; lower the thresholds")
    counts["output"] = output
    return kept, counts


def write_interactions(path: Path, pairs: DataFrame, remote: str | None = None
                       ) -> dict[str, dict[str, Any]]:
    """``interactions.parquet`` sorted by (user_id, item_id): streamed from the sort to
    ``path`` by the driver, or, given ``remote`` (the output's S3 staging prefix), written
    by the tasks as parts ``interactions/part-*.parquet`` there (``sorted_parts``), which
    the returned ``{name: {"sha256", "bytes", "rows"}}`` lists (empty for ``path``)."""
    import pyarrow as pa

    schema = pa.schema([("user_id", arrow_type(pairs, "user_id")),
                        ("item_id", arrow_type(pairs, "item_id"))])
    if remote is not None:
        return sorted_parts(pairs, ["user_id", "item_id"], remote, INTERACTIONS_PARTS, schema)
    for _ in save_parquet_batches(path, schema, sorted_batches(pairs, ["user_id", "item_id"])):
        pass
    return {}
