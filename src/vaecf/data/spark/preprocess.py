"""``vaecf preprocess --engine spark``: the pandas engine's steps on Spark DataFrames.

The raw rows come from ``vaecf.data.spark.raw`` (every layout the pandas engine reads, with
its checks and its lines for bad input). Then the same steps, counted the same way:
``raw`` -> ``implicit`` -> ``dedup`` -> ``item_filter`` -> ``user_filter`` (-> ``k_core``).

Every count and every filter comes from per-id counts (one row per user, one per item: hash
aggregates, no sort), and the pairs are deduplicated once, hashed by user: the per-user
counts and the user filter then run in that partitioning, with no further shuffle of the
pairs, and the item filter joins the small per-item table broadcast. Measured at 9.9M
positives (notes/i38speed.md): windows over users and items (two sorts of every pair), a
checkpoint per step and three distinct counts per step took most of the stage's CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from vaecf.data.preprocess import INTERACTIONS_PARTS, FilterConfig
from vaecf.data.spark.frames import arrow_type, partitions, sorted_batches, sorted_parts
from vaecf.data.spark.raw import RawFrame
from vaecf.data.splits import STREAM_GROUP_ROWS, save_parquet_batches
from vaecf.errors import VaecfError
from vaecf.io.readers import MAX_ID_BYTES, id_too_long

_N = "_n"
_IDS = ("user_id", "item_id")


def _per_id(pairs: DataFrame, column: str) -> DataFrame:
    """(``column``, ``_n``): the rows of ``pairs`` of each id (a hash aggregate)."""
    return pairs.groupBy(column).agg(F.count(F.lit(1)).alias(_N))


def _totals(frame: DataFrame, *columns: Column) -> list[int]:
    """The aggregates ``columns`` of a (small) per-id table, in one job."""
    row = frame.agg(*columns).first()
    assert row is not None  # an aggregate without grouping has one row
    return [int(value or 0) for value in row]


def _raw_counts(rows: DataFrame, positive: Column) -> dict[str, dict[str, int]]:
    """The ``raw`` and ``implicit`` steps' counts, from per-user and per-item counts of the
    raw rows and of their positives (two aggregates, one pass each)."""
    users = rows.groupBy("user_id").agg(F.count(F.lit(1)).alias(_N),
                                        F.count_if(positive).alias("_p"))
    items = rows.groupBy("item_id").agg(F.count_if(positive).alias("_p"))
    n_rows, n_users, positives, positive_users = _totals(
        users, F.sum(_N), F.count(F.lit(1)), F.sum("_p"), F.count_if(F.col("_p") > 0))
    n_items, positive_items = _totals(items, F.count(F.lit(1)), F.count_if(F.col("_p") > 0))
    return {"raw": {"rows": n_rows, "users": n_users, "items": n_items},
            "implicit": {"rows": positives, "users": positive_users, "items": positive_items}}


def _longest(ids: DataFrame, column: str) -> int:
    """The most bytes of an id of ``ids`` as text (0 for integers: at most 20 digits)."""
    if not isinstance(ids.schema[column].dataType, T.StringType):
        return 0
    return _totals(ids, F.max(F.octet_length(column)))[0]


def _check_ids(pairs: DataFrame, users: DataFrame, items: DataFrame, source: str) -> None:
    """The pandas engine's id limit (``vaecf.io.readers.check_ids``), on each distinct id
    once (``users``, ``items``: the per-id tables of ``pairs``)."""
    for column, ids in zip(_IDS, (users, items), strict=True):
        if _longest(ids, column) > MAX_ID_BYTES:
            text = F.col(column).cast("string")
            row = pairs.where(F.octet_length(text) > MAX_ID_BYTES).select(text.alias("id")).first()
            assert row is not None
            raise id_too_long(source, column, row["id"], len(row["id"].encode()))


def _step(users: DataFrame, items: DataFrame) -> dict[str, int]:
    """``{"rows", "users", "items"}`` of pairs, from their per-user and per-item tables."""
    n_rows, n_users = _totals(users, F.sum(_N), F.count(F.lit(1)))
    return {"rows": n_rows, "users": n_users, "items": _totals(items, F.count(F.lit(1)))[0]}


def _filter(pairs: DataFrame, items: DataFrame, rows: int, parts: int, config: FilterConfig,
            counts: dict[str, Any]) -> tuple[DataFrame, dict[str, int]]:
    """Items first, then users; repeated until stable with ``k_core`` (as the pandas engine).
    ``pairs``: hashed by user into ``parts`` partitions, persisted; ``items``: its per-item
    table; ``rows``: its rows.
    Returns the pairs kept and their counts."""
    rounds = 0
    while True:
        rounds += 1
        before, previous = rows, pairs
        if config.min_item_users > 0:
            items = items.where(F.col(_N) >= config.min_item_users)
            pairs = pairs.join(F.broadcast(items.select("item_id")), "item_id", "left_semi")
        users = _per_id(pairs, "user_id").persist()
        if rounds == 1:
            counts["item_filter"] = _step(users, items)
        users = users.where(F.col(_N) >= config.min_user_items)
        # both sides hashed by user: the users' table is built in each partition, no shuffle
        pairs = pairs.join(users.select("user_id").hint("shuffle_hash"), "user_id", "left_semi")
        if config.k_core:  # the next round reads this round's pairs, not the chain of joins
            pairs = pairs.persist()
        items = _per_id(pairs, "item_id").coalesce(parts).persist()
        kept = _step(users, items)
        rows = kept["rows"]
        if rounds == 1:
            counts["user_filter"] = kept
        if config.k_core and rounds > 1:
            previous.unpersist()
        if not config.k_core or rows in (before, 0):
            break
    if config.k_core:
        counts["k_core"] = {**kept, "rounds": rounds}
    return pairs, kept


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
    ``source`` names the files read in errors (``files_read``).

    The deduplicated pairs, hashed by user, and the per-id tables stay persisted for the
    pairs returned (freed with the session)."""
    try:
        positive = _positive(raw.kind, config)
        counts: dict[str, Any] = {**raw.counts, **_raw_counts(raw.rows, positive)}
        if counts["implicit"]["rows"] == 0:
            raise VaecfError(f"no positives: no {raw.kind} passes the threshold (--min-rating "
                             f"{config.min_rating:g}, --min-plays {config.min_plays})")
        implicit = raw.rows.where(positive).select(*_IDS)
        parts = partitions(implicit, counts["implicit"]["rows"])
        dedup = implicit.repartition(parts, "user_id").distinct().persist()
        # the items' table in as many partitions as the pairs, not Spark's 200 shuffle
        # partitions: a cached table keeps them, and every pass reading it pays 200 tasks
        users = _per_id(dedup, "user_id").persist()
        items = _per_id(dedup, "item_id").coalesce(parts).persist()
        counts["dedup"] = _step(users, items)  # the first job to read dedup: it is cached
    finally:
        raw.cached.unpersist()
    _check_ids(dedup, users, items, source)
    users.unpersist()
    counts["duplicates"] = counts["implicit"]["rows"] - counts["dedup"]["rows"]
    kept, output = _filter(dedup, items, counts["dedup"]["rows"], parts, config, counts)
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
        return sorted_parts(pairs, ["user_id", "item_id"], remote, INTERACTIONS_PARTS,
                            STREAM_GROUP_ROWS, schema)
    for _ in save_parquet_batches(path, schema, sorted_batches(pairs, ["user_id", "item_id"])):
        pass
    return {}
