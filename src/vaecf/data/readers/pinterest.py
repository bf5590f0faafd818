"""Pinterest (pinterest-20 of He et al., NCF, WWW 2017): boards as users, pins as items.

``pinterest-20.train.rating`` and ``pinterest-20.test.rating`` are tab-separated without a
header: ``user<TAB>item<TAB>rating[<TAB>timestamp]``, integer ids; every row is a positive
(the test file holds each user's left-out pin, so both files together are the full data).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

import numpy as np
import pyarrow as pa

from vaecf.data.readers.archive import DataFile, member_path
from vaecf.data.readers.table import (
    CsvLayout,
    RawInteractions,
    Rows,
    column,
    field_count,
    has_nulls,
    int_field,
    read_rows,
)
from vaecf.errors import VaecfError
from vaecf.io import storage

_DATA_FILE = re.compile(r"(pinterest-\d+)\.(train|test)\.rating")


def is_pinterest_file(path: str) -> bool:
    return _DATA_FILE.fullmatch(PurePosixPath(path).name) is not None


def missing_pinterest_file(labels: list[str]) -> str | None:
    """What is missing when a train file comes without its test file or the other way round.

    Either file alone is not the dataset: the test file alone holds one pin per board (every
    board would be filtered out, and the message would blame the thresholds), the train
    file alone lacks every board's held-out pin.
    """
    found: dict[str, set[str]] = {}
    for label in labels:
        match = _DATA_FILE.fullmatch(PurePosixPath(member_path(label)).name)
        if match:
            found.setdefault(match.group(1), set()).add(match.group(2))
    for prefix, parts in sorted(found.items()):
        missing = sorted({"train", "test"} - parts)
        if missing:
            return (f"{prefix}.{missing[0]}.rating is missing (found {', '.join(labels)}); "
                    f"pinterest needs both {prefix}.train.rating and {prefix}.test.rating")
    return None


def _rows(table: pa.Table) -> Rows | None:
    """Every row is a positive; no empty id."""
    if has_nulls(table, ["user", "item"]):
        return None
    return Rows(column(table, "user", np.int64), column(table, "item", np.int64),
                np.ones(table.num_rows))


def file_layout(file: DataFile) -> CsvLayout:
    """3 or 4 columns, as the file's first line says."""
    with storage.open_source(file.path) as handle:
        first = handle.readline()
    if not first.strip():
        raise VaecfError(f"{file.label}: file is empty")
    width = len(first.split(b"\t"))
    if width not in (3, 4):
        raise VaecfError(f"{file.label}: line 1: expected 3 or 4 tab-separated fields "
                         f"(user, item, rating[, timestamp]), got {width}")
    names = ("user", "item", "rating", "timestamp")[:width]

    def check(fields: list[str]) -> str | None:
        return field_count(fields, names) or int_field("user", fields[0]) or int_field(
            "item", fields[1])

    return CsvLayout(names=names, types={"user": pa.int64(), "item": pa.int64()},
                     check=check, rows=_rows, delimiter="\t", header=False)


def read_pinterest_file(file: DataFile) -> RawInteractions:
    return read_rows(file, file_layout(file), "implicit")
