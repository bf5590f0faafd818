"""DataFrame helpers of the Spark engine: global ranks, sorted streams to the driver or
sorted parts written by the tasks, keys.

Nothing here gathers a whole DataFrame on one node: a global rank numbers each range
partition of a sort and adds the partition's offset (a single-partition window would move
every row to one task), and a sorted stream reaches the driver one partition at a time as
Arrow IPC batches.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

_PART, _POS, _OFFSET = "_vaecf_part", "_vaecf_pos", "_vaecf_offset"
# Rows of pairs per partition of a frame partitioned by user. Spark's 200 shuffle partitions
# cost each task its own hash maps and pages: at 9.9M positives a pass over 200 cached
# partitions took several times the CPU of the same pass over 5 (notes/i38speed.md); a task
# of the split holds its partition's pairs in memory (``split_tasks``), ~100 bytes each.
ROWS_PER_PARTITION = 2_000_000


def partitions(frame: DataFrame, rows: int) -> int:
    """Partitions for ``rows`` rows of pairs: about ``ROWS_PER_PARTITION`` each, at least one
    per core."""
    return max(frame.sparkSession.sparkContext.defaultParallelism, -(-rows // ROWS_PER_PARTITION))


def with_rank(frame: DataFrame, order: list[str | Column], name: str) -> DataFrame:
    """``frame`` with a column ``name``: each row's 0-based position in ``order`` (long).

    The sort's range partitions are numbered inside (in order, as they arrive), their sizes
    collected (one row per partition) and each partition's offset added. The numbered rows
    are checkpointed (on the executors, freed with the DataFrame): the sizes and the result
    must come from the same partitioning.
    """
    ordered = frame.orderBy(*order).withColumn(_PART, F.spark_partition_id())
    schema = T.StructType([*ordered.schema.fields, T.StructField(_POS, T.LongType(), False)])

    def number(batches: Iterable[pa.RecordBatch]) -> Iterable[pa.RecordBatch]:
        position = 0
        for batch in batches:
            positions = np.arange(position, position + batch.num_rows, dtype=np.int64)
            position += batch.num_rows
            yield pa.RecordBatch.from_arrays([*batch.columns, pa.array(positions)],
                                             schema=batch.schema.append(pa.field(_POS,
                                                                                 pa.int64())))

    numbered = ordered.mapInArrow(number, schema).localCheckpoint()
    sizes = sorted(tuple(row) for row in numbered.groupBy(_PART).count().collect())
    offsets = np.concatenate([[0], np.cumsum([size for _, size in sizes])[:-1]]).tolist()
    table = frame.sparkSession.createDataFrame(
        [(part, int(offset)) for (part, _), offset in zip(sizes, offsets, strict=True)],
        T.StructType([T.StructField(_PART, T.IntegerType()),
                      T.StructField(_OFFSET, T.LongType())]))
    return numbered.join(F.broadcast(table), _PART).select(
        *frame.columns, (F.col(_POS) + F.col(_OFFSET)).alias(name))


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
