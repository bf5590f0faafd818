"""DataFrame helpers of the Spark engine: sorted streams to the driver or sorted parts
written by the tasks, partition sizes, keys.

Nothing here gathers a whole DataFrame on one node: a sorted stream reaches the driver one
partition at a time as Arrow IPC batches, and sorted parts are written by the tasks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

# Rows of pairs per partition of a frame partitioned by user. Spark's 200 shuffle partitions
# cost each task its own hash maps and pages: at 9.9M positives a pass over 200 cached
# partitions took several times the CPU of the same pass over 5 (notes/i38speed.md); a task
# of the split holds its partition's pairs in memory (``split_tasks``), ~100 bytes each.
ROWS_PER_PARTITION = 2_000_000


def partitions(frame: DataFrame, rows: int) -> int:
    """Partitions for ``rows`` rows of pairs: about ``ROWS_PER_PARTITION`` each, at least one
    per core."""
    return max(frame.sparkSession.sparkContext.defaultParallelism, -(-rows // ROWS_PER_PARTITION))


def sorted_batches(frame: DataFrame, order: list[str]) -> Iterator[pa.RecordBatch]:
    """The rows of ``frame`` sorted by ``order``, as Arrow batches on the driver.

    Partitions of the sort arrive one at a time (the next one prefetched), each as Arrow IPC
    blobs of ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows: the driver holds about
    two partitions, never the DataFrame.
    """
    def to_ipc(batches: Iterable[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
        for batch in batches:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batch.schema) as writer:
                writer.write_batch(batch)
            yield pa.RecordBatch.from_pydict({"ipc": [sink.getvalue().to_pybytes()]})

    blobs = frame.orderBy(*order).mapInArrow(to_ipc, "ipc binary")
    for row in blobs.toLocalIterator(prefetchPartitions=True):
        yield from pa.ipc.open_stream(row["ipc"])


def sorted_parts(frame: DataFrame, order: list[str], uri: str, table: str, group_rows: int,
                 schema: pa.Schema) -> dict[str, dict[str, Any]]:
    """The rows of ``frame`` sorted by ``order``, written by the tasks as Parquet parts
    ``<uri>/<table>/part-<partition>.parquet`` (``pieces.write_parts``, in row groups of
    ``group_rows`` rows): each range partition of the sort is one part, so the parts, in
    name order, hold the rows in ``order``.

    Returns:
      ``{part name: {"sha256", "bytes", "rows", "row_groups"}}``, parts in order: what the
      driver receives (one row per part), never the rows; ``row_groups``: ``[first value,
      rows]`` of each row group of the part, the value of the first column written.
    """
    from vaecf.data.spark.pieces import PARTS, write_parts
    from vaecf.data.spark.raw import task_environment

    written = frame.orderBy(*order).mapInArrow(
        partial(write_parts, uri=uri, name=table, schema=schema,
                environment=task_environment(frame.sparkSession), group_rows=group_rows),
        from_arrow_schema(PARTS))
    return parts_found(written.collect())


def parts_found(rows: list[Any]) -> dict[str, dict[str, Any]]:
    """``{part name: {"sha256", "bytes", "rows", "row_groups"}}`` of the ``PARTS`` rows the
    tasks returned, in name order."""
    return {row["name"]: {"sha256": row["sha256"], "bytes": int(row["bytes"]),
                          "rows": int(row["rows"]), "row_groups": json.loads(row["row_groups"])}
            for row in sorted(rows, key=lambda row: row["name"])}


def id_key(seed: int, column: str) -> Column:
    """Each id's split key (``split_keys.text_keys``) in Spark's own expressions: the first
    16 hex digits of ``sha2`` over ``"<seed>\\x1f<id text>"``, read as a signed long."""
    text = F.concat(F.lit(f"{int(seed)}\x1f"), F.col(column).cast("string"))
    return F.conv(F.substring(F.sha2(text, 256), 1, 16), 16, -10).cast("long")


def arrow_type(frame: DataFrame, column: str) -> pa.DataType:
    """The Arrow type of an id column, as pandas writes it (text as ``string``)."""
    from pyspark.sql.pandas.types import to_arrow_type

    kind = to_arrow_type(frame.schema[column].dataType)
    return pa.string() if pa.types.is_large_string(kind) else kind
