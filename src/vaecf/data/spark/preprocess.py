"""``vaecf preprocess --engine spark``: the pandas engine's steps on Spark DataFrames.

Reads MovieLens' three layouts with Spark's CSV reader and an explicit schema. A row Spark
refuses (a wrong field count), an empty or malformed value, or a rating outside 0.5..5 sends
the file to the pandas reader's line-by-line pass (``locate_error``), which names the file
and the line with the pandas engine's words. Then the same steps, counted the same way:
``raw`` -> ``implicit`` -> ``dedup`` -> ``item_filter`` -> ``user_filter`` (-> ``k_core``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.window import Window

from vaecf.data.preprocess import FilterConfig
from vaecf.data.readers import check_data_files
from vaecf.data.readers.archive import DataFile
from vaecf.data.readers.movielens import (
    MAX_RATING,
    MIN_RATING,
    file_layout,
    is_ratings_file,
    ratings_layout,
)
from vaecf.data.readers.table import locate_error
from vaecf.data.spark.frames import sorted_batches, step_counts
from vaecf.data.splits import save_parquet_batches
from vaecf.errors import VaecfError

# What pyarrow (the pandas engine) parses as a rating; Spark's own double parser would also
# take "4d", "0x1p2" or "Infinity".
_NUMBER = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"
_SPARK_REFUSED = "Spark's CSV reader refused a row"


def _schema(names: tuple[str, ...], strict: tuple[str, ...]) -> T.StructType:
    """ids as longs, the rating as text (checked by ``_NUMBER``), ``strict`` columns as
    longs too, the rest as text; ``::`` layouts have no padding columns here."""
    longs = ("userId", "movieId", *strict)
    return T.StructType([T.StructField(n, T.LongType() if n in longs else T.StringType())
                         for n in names if not n.startswith("_")])


def read_ratings(spark: SparkSession, file: DataFile) -> DataFrame:
    """(user_id long, item_id long, value double) of one MovieLens ratings file, checked."""
    if file.path.stat().st_size == 0:
        raise VaecfError(f"{file.label}: file is empty")
    layout = file_layout(file)  # reads and checks a ratings.csv header
    name = ratings_layout(file.label)
    strict = () if name == "ratings.csv" else ("timestamp",)
    frame = spark.read.csv(str(file.path), schema=_schema(layout.names, strict),
                           header=layout.header, sep=layout.separator or layout.delimiter,
                           quote="", mode="FAILFAST", encoding="UTF-8")
    rating = F.col("rating")
    value = F.when(rating.rlike(_NUMBER), rating.try_cast("double"))
    bad = (F.col("userId").isNull() | F.col("movieId").isNull() | value.isNull()
           | (value < MIN_RATING) | (value > MAX_RATING))
    for column in strict:
        bad = bad | F.col(column).isNull()
    # Every column is read, so that Spark's column pruning cannot skip a row's missing fields
    # (a line cut short): its FAILFAST parser then refuses the row.
    every = [F.count(c).alias(f"_{c}") for c in frame.columns]
    try:
        found = frame.agg(F.count(F.lit(1)).alias("rows"), F.count_if(bad).alias("bad"),
                          *every).first()
    except Exception as err:  # the FAILFAST row: py4j's error, whatever Spark's class
        if "MALFORMED" not in str(err) and "FAILED_READ_FILE" not in str(err):
            raise
        raise locate_error(file, layout, _SPARK_REFUSED) from None
    assert found is not None
    if found["rows"] == 0:
        raise VaecfError(f"{file.label}: no data rows (header only?)")
    if found["bad"]:
        raise locate_error(file, layout, _SPARK_REFUSED)
    return frame.select(F.col("userId").alias("user_id"), F.col("movieId").alias("item_id"),
                        value.alias("value"))


def read_raw(spark: SparkSession, reader: str, files: list[DataFile],
             names: list[str], where: str) -> DataFrame:
    """The raw rows of a download's data files; MovieLens layouts only."""
    if reader != "movielens" or not all(is_ratings_file(f.label) for f in files):
        raise VaecfError(f"{where}: --engine spark reads the MovieLens layouts (ratings.csv, "
                         f"ratings.dat, u.data); use --engine pandas for this dataset")
    check_data_files(reader, [f.label for f in files], names, where)
    return read_ratings(spark, files[0])


def _keep_frequent(frame: DataFrame, column: str, minimum: int) -> DataFrame:
    """Rows whose ``column`` value occurs at least ``minimum`` times (``keep_frequent``)."""
    size = F.count(F.lit(1)).over(Window.partitionBy(column))
    return frame.withColumn("_n", size).where(F.col("_n") >= minimum).drop("_n")


def _filter(pairs: DataFrame, config: FilterConfig, counts: dict[str, Any]) -> DataFrame:
    """Items first, then users; repeated until stable with ``k_core`` (as the pandas engine)."""
    rounds = 0
    while True:
        rounds += 1
        before = pairs.count()
        if config.min_item_users > 0:
            pairs = _keep_frequent(pairs, "item_id", config.min_item_users)
        if rounds == 1:
            pairs = pairs.localCheckpoint()
            counts["item_filter"] = step_counts(pairs)
        pairs = _keep_frequent(pairs, "user_id", config.min_user_items).localCheckpoint()
        rows = pairs.count()
        if rounds == 1:
            counts["user_filter"] = step_counts(pairs)
        if not config.k_core or rows in (before, 0):
            break
    if config.k_core:
        counts["k_core"] = {**step_counts(pairs), "rounds": rounds}
    return pairs


def preprocess(raw: DataFrame, config: FilterConfig) -> tuple[DataFrame, dict[str, Any]]:
    """Positives of ``raw`` after dedup and filtering, and the counts of every step."""
    raw = raw.persist()
    try:
        counts: dict[str, Any] = {"raw": step_counts(raw)}
        implicit = raw.where(F.col("value") >= config.min_rating).select("user_id", "item_id")
        counts["implicit"] = step_counts(implicit)
        if counts["implicit"]["rows"] == 0:
            raise VaecfError(f"no positives: no rating passes the threshold (--min-rating "
                             f"{config.min_rating:g}, --min-plays {config.min_plays})")
        dedup = implicit.distinct().localCheckpoint()
    finally:
        raw.unpersist()
    distinct = step_counts(dedup)
    counts["duplicates"] = counts["implicit"]["rows"] - distinct["rows"]
    counts["dedup"] = distinct
    kept = _filter(dedup, config, counts)
    output = step_counts(kept)
    if output["rows"] == 0:
        raise VaecfError(
            f"every user was filtered out: none of {counts['dedup']['users']:,} users keeps "
            f"--min-user-items {config.min_user_items} items after dropping items with fewer "
            f"than --min-item-users {config.min_item_users} users; lower the thresholds")
    counts["output"] = output
    return kept, counts


def write_interactions(path: Path, pairs: DataFrame) -> None:
    """``interactions.parquet`` sorted by (user_id, item_id), streamed from the sort."""
    import pyarrow as pa

    schema = pa.schema([("user_id", pa.int64()), ("item_id", pa.int64())])
    for _ in save_parquet_batches(path, schema, sorted_batches(pairs, ["user_id", "item_id"])):
        pass
