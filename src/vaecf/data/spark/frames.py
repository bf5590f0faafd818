"""DataFrame helpers of the Spark engine: partition sizes, the parts the tasks wrote, types."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

# Rows of pairs per partition of a frame partitioned by user. Spark's 200 shuffle partitions
# cost each task its own hash maps and pages: at 9.9M positives a pass over 200 cached
# partitions took several times the CPU of the same pass over 5 (notes/i38speed.md). A task
# of either stage holds its partition's pairs in memory (``split_tasks``, ``preprocess_tasks``).
ROWS_PER_PARTITION = 2_000_000


def partitions(frame: DataFrame, rows: int) -> int:
    """Partitions for ``rows`` rows of pairs: about ``ROWS_PER_PARTITION`` each, at least one
    per core."""
    return max(frame.sparkSession.sparkContext.defaultParallelism, -(-rows // ROWS_PER_PARTITION))


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
