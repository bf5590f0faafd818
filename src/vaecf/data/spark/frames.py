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

from vaecf.data.split_keys import GOLDEN, MIX1, MIX2

_PART, _POS, _OFFSET = "_vaecf_part", "_vaecf_pos", "_vaecf_offset"
# Rows of pairs per partition of a frame hashed by user. Spark's 200 shuffle partitions cost
# each task its own hash maps and pages: at 9.9M positives a pass over 200 cached partitions
# took several times the CPU of the same pass over 5 (notes/i38speed.md).
ROWS_PER_PARTITION = 2_000_000


def partitions(frame: DataFrame, rows: int) -> int:
    """Partitions for ``rows`` rows of pairs: about ``ROWS_PER_PARTITION`` each, at least one
    per core."""
    return max(frame.sparkSession.sparkContext.defaultParallelism, -(-rows // ROWS_PER_PARTITION))


def hashed_by_user(frame: DataFrame, rows: int) -> DataFrame:
    """``frame`` (``rows`` rows) hashed by ``user_id`` into ``partitions``: every per-user
    aggregate, window and join on ``user_id`` then runs inside the partitions, with no
    shuffle of the pairs."""
    return frame.repartition(partitions(frame, rows), "user_id")


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


def sorted_parts(frame: DataFrame, order: list[str], uri: str, tables: dict[str, int],
                 schema: pa.Schema, by_code: bool = False) -> dict[str, dict[str, dict[str, Any]]]:
    """The rows of ``frame`` sorted by ``order``, written by the tasks as Parquet parts
    ``<uri>/<table>/part-<partition>.parquet`` (``pieces.write_parts``, in row groups of
    ``tables[table]`` rows): each range partition of the sort is one part of each table it
    holds, so a table's parts, in name order, hold its rows in ``order``. One table, or with
    ``by_code`` several in one sort: ``order``'s first column, the first of ``frame``, is
    then each row's table (its index in ``tables``), and is not written.

    Returns:
      ``{table: {part name: {"sha256", "bytes", "rows", "row_groups"}}}``, parts in order:
      what the driver receives (one row per part), never the rows; ``row_groups``: ``[first
      value, rows]`` of each row group of the part, the value of the first column written
      (the sort's first key after the table's).
    """
    from vaecf.data.spark.pieces import PARTS, write_parts
    from vaecf.data.spark.raw import task_environment

    names = list(tables)
    written = frame.orderBy(*order).mapInArrow(
        partial(write_parts, uri=uri, names=names, schema=schema,
                environment=task_environment(frame.sparkSession),
                group_rows=list(tables.values()), by_code=by_code),
        from_arrow_schema(PARTS))
    found: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in names}
    for row in sorted(written.collect(), key=lambda row: row["name"]):  # table, partition
        found[row["name"].rpartition("/")[0]][row["name"]] = {
            "sha256": row["sha256"], "bytes": int(row["bytes"]), "rows": int(row["rows"]),
            "row_groups": json.loads(row["row_groups"])}
    return found


def id_key(seed: int, column: str) -> Column:
    """Each id's split key (``split_keys.text_keys``) in Spark's own expressions: the first
    16 hex digits of ``sha2`` over ``"<seed>\\x1f<id text>"``, read as a signed long."""
    text = F.concat(F.lit(f"{int(seed)}\x1f"), F.col(column).cast("string"))
    return F.conv(F.substring(F.sha2(text, 256), 1, 16), 16, -10).cast("long")


def pair_key(frame: DataFrame, user_key: str, item_key: str, name: str) -> DataFrame:
    """``frame`` with a column ``name``: each pair's key (``split_keys.pair_keys``) in
    Spark's own expressions.

    SplitMix64's wrapping 64-bit products are built from 16-bit pieces (``_times``), which
    no ANSI overflow check refuses; each step is a column of its own, so that an expression
    never holds its input more than a few times over.
    """
    x = F.col("_vaecf_x")
    steps = [F.col(user_key).bitwiseXOR(_times(F.col(item_key), _GOLDEN)),
             x.bitwiseXOR(F.shiftrightunsigned(x, 30)), _times(x, _MIX1),
             x.bitwiseXOR(F.shiftrightunsigned(x, 27)), _times(x, _MIX2),
             x.bitwiseXOR(F.shiftrightunsigned(x, 31))]
    for step in steps:
        frame = frame.withColumn("_vaecf_x", step)
    return frame.withColumnRenamed("_vaecf_x", name)


_GOLDEN, _MIX1, _MIX2 = (int(c) for c in (GOLDEN, MIX1, MIX2))
_LOW16, _LOW32 = 0xFFFF, 0xFFFFFFFF


def _times(x: Column, constant: int) -> Column:
    """``x * constant`` modulo 2**64, as a signed long, without a product beyond 2**34.

    With x = xh 2**32 + xl and c = ch 2**32 + cl (unsigned halves), the product's low word is
    that of xl cl, and its high word that of xl cl's carry + xh cl + xl ch; xl cl is summed
    from 16-bit pieces, the other two taken modulo 2**32 (``_times_low``).
    """
    low, high = x.bitwiseAND(_LOW32), F.shiftrightunsigned(x, 32)
    c_low, c_high = constant & _LOW32, constant >> 32
    a0, a1 = low.bitwiseAND(_LOW16), F.shiftright(low, 16)
    b0, b1 = c_low & _LOW16, c_low >> 16
    middle = a1 * b0 + a0 * b1
    bottom = a0 * b0 + F.shiftleft(middle.bitwiseAND(_LOW16), 16)
    top = (a1 * b1 + F.shiftright(middle, 16) + F.shiftright(bottom, 32)
           + _times_low(high, c_low) + _times_low(low, c_high))
    return F.shiftleft(top.bitwiseAND(_LOW32), 32).bitwiseOR(bottom.bitwiseAND(_LOW32))


def _times_low(x: Column, constant: int) -> Column:
    """``x * constant`` modulo 2**32 (plus a multiple of 2**32 below 2**34), x < 2**32."""
    x0, x1 = x.bitwiseAND(_LOW16), F.shiftright(x, 16)
    c0, c1 = constant & _LOW16, constant >> 16
    return x0 * c0 + F.shiftleft((x1 * c0 + x0 * c1).bitwiseAND(_LOW16), 16)


def arrow_type(frame: DataFrame, column: str) -> pa.DataType:
    """The Arrow type of an id column, as pandas writes it (text as ``string``)."""
    from pyspark.sql.pandas.types import to_arrow_type

    kind = to_arrow_type(frame.schema[column].dataType)
    return pa.string() if pa.types.is_large_string(kind) else kind
