"""MovieLens ratings, in the three layouts GroupLens has published them.

- ``ratings.csv`` (ml-20m, ml-25m, ml-32m, ml-latest, ml-latest-small, and the synthetic
  data): ``userId,movieId,rating,timestamp`` with a header, half stars 0.5 to 5.0.
- ``ratings.dat`` (ml-1m, ml-10m): ``UserID::MovieID::Rating::Timestamp``, no header.
- ``u.data`` (ml-100k): ``user id<TAB>item id<TAB>rating<TAB>timestamp``, no header.

A file is found by its name, inside the GroupLens zip (``ml-1m/ratings.dat``) or as a plain
file, and its name is its layout. ML-100K's ``u1.base`` ... ``ub.test`` are splits of
``u.data`` and are not read.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import PurePosixPath

import numpy as np
import pyarrow as pa

from vaecf.data.readers.archive import DataFile, member_path
from vaecf.data.readers.table import (
    CsvLayout,
    RawInteractions,
    Rows,
    checked_rows,
    column,
    field_count,
    has_nulls,
    header_names,
    int_field,
    iter_checked,
    number_field,
    raw_interactions,
    read_header_of,
)
from vaecf.errors import VaecfError

LAYOUTS = ("ratings.csv", "ratings.dat", "u.data")
REQUIRED = ("userId", "movieId", "rating")
NAMES = (*REQUIRED, "timestamp")
MIN_RATING, MAX_RATING = 0.5, 5.0
_TYPES = {"userId": pa.int64(), "movieId": pa.int64(), "rating": pa.float64()}


def ratings_layout(path: str) -> str | None:
    """The layout of a file, archive member or label (its name), or None if no ratings file."""
    name = PurePosixPath(member_path(path)).name
    return name if name in LAYOUTS else None


def is_ratings_file(path: str) -> bool:
    return ratings_layout(path) is not None


def read_header(file: DataFile) -> tuple[str, ...]:
    """The header's column names; VaecfError if the file is empty or lacks a column."""
    return read_header_of(file, REQUIRED)


def parse_header(label: str, first: bytes) -> tuple[str, ...]:
    """The column names of ``first``, the file's first line read with a limit of 64 KiB."""
    return header_names(label, first, REQUIRED)


def _rows(table: pa.Table) -> Rows | None:
    """Ratings in 0.5..5.0, no empty value."""
    if has_nulls(table, list(REQUIRED)):
        return None
    rating = column(table, "rating", np.float64)
    if not ((rating >= MIN_RATING) & (rating <= MAX_RATING)).all():
        return None
    return Rows(column(table, "userId", np.int64), column(table, "movieId", np.int64), rating)


def _csv_layout(names: tuple[str, ...]) -> CsvLayout:
    where = {name: names.index(name) for name in REQUIRED}

    def check(fields: list[str]) -> str | None:
        return (field_count(fields, names)
                or int_field("userId", fields[where["userId"]])
                or int_field("movieId", fields[where["movieId"]])
                or number_field("rating", fields[where["rating"]], MIN_RATING, MAX_RATING))

    return CsvLayout(names=names, types=_TYPES, check=check, rows=_rows)


def _check_fixed(fields: list[str]) -> str | None:
    """A ``ratings.dat`` or ``u.data`` line: four fields, integers but the rating."""
    return (field_count(fields, NAMES) or int_field("userId", fields[0])
            or int_field("movieId", fields[1])
            or number_field("rating", fields[2], MIN_RATING, MAX_RATING)
            or int_field("timestamp", fields[3]))


# pyarrow's delimiter is one character: "a::b" is read as "a", "", "b" (see CsvLayout).
_DAT = CsvLayout(names=("userId", "_1", "movieId", "_2", "rating", "_3", "timestamp"),
                 types={**_TYPES, "_1": pa.null(), "_2": pa.null(), "_3": pa.null()},
                 check=_check_fixed, rows=_rows, delimiter=":", separator="::", header=False)
_U_DATA = CsvLayout(names=NAMES, types=_TYPES, check=_check_fixed, rows=_rows, delimiter="\t",
                    header=False)


def probe_ratings(label: str, first: bytes) -> None:
    """Refuse a ratings file whose first line (read up to 64 KiB) cannot start its layout.

    ``vaecf download`` calls this, so a file that is no MovieLens ratings file of its
    layout fails there; ``read_ratings`` checks every line later.
    """
    if ratings_layout(label) == "ratings.csv":
        parse_header(label, first)
        return
    if not first:
        raise VaecfError(f"{label}: file is empty")
    try:
        text = first.decode("utf-8-sig").rstrip("\r\n")
    except UnicodeDecodeError:
        raise VaecfError(f"{label}: line 1: bytes are not UTF-8") from None
    layout = _DAT if ratings_layout(label) == "ratings.dat" else _U_DATA
    problem = layout.check(layout.split(text))
    if problem:
        raise VaecfError(f"{label}: line 1: {problem}")


def file_layout(file: DataFile) -> CsvLayout:
    """The layout of a ratings file: by its name, and for ``ratings.csv`` its header."""
    name = ratings_layout(file.label)
    return _DAT if name == "ratings.dat" else _U_DATA if name == "u.data" else (
        _csv_layout(read_header(file)))


def read_ratings(file: DataFile) -> Iterator[RawInteractions]:
    """Read one MovieLens ratings file in the layout its name says (errors name the line),
    a block of rows at a time: ML-32M's 32M ratings, or 200M synthetic ones, are never
    all in memory as text-parsed columns (preprocess keeps each block's positives)."""
    layout = file_layout(file)
    for piece in iter_checked(file, layout):
        yield raw_interactions(checked_rows(file, layout, piece), "rating", file.label)
