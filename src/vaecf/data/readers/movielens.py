"""MovieLens ``ratings.csv`` (ml-20m, ml-25m, ml-latest-small, and the synthetic data).

The file is ``userId,movieId,rating,timestamp`` with a header, ratings in half stars from
0.5 to 5.0. It is found by name, inside the GroupLens zip (``ml-20m/ratings.csv``,
``ml-25m/ratings.csv``, ``ml-latest-small/ratings.csv``) or as a plain file.
"""

from __future__ import annotations

from pathlib import PurePosixPath

import numpy as np
import pyarrow as pa

from vaecf.data.readers.archive import DataFile
from vaecf.data.readers.table import (
    CsvLayout,
    RawInteractions,
    column,
    field_count,
    has_nulls,
    int_field,
    locate_error,
    number_field,
    read_checked,
)
from vaecf.errors import VaecfError

REQUIRED = ("userId", "movieId", "rating")
MIN_RATING, MAX_RATING = 0.5, 5.0


def is_ratings_file(path: str) -> bool:
    return PurePosixPath(path).name == "ratings.csv"


def read_header(file: DataFile) -> tuple[str, ...]:
    """The header's column names; VaecfError if the file is empty or lacks a column."""
    with open(file.path, "rb") as handle:
        first = handle.readline()
    if not first:
        raise VaecfError(f"{file.label}: file is empty")
    try:
        # Quoted names ("userId") are accepted: some CSV writers quote the header only.
        names = tuple(name.strip('"') for name in first.decode("utf-8").strip().split(","))
    except UnicodeDecodeError:
        raise VaecfError(f"{file.label}: line 1: header bytes are not UTF-8") from None
    for name in REQUIRED:
        if name not in names:
            raise VaecfError(f"{file.label}: line 1: missing column '{name}' "
                             f"(header is '{','.join(names)}'; expected {', '.join(REQUIRED)})")
    return names


def _layout(names: tuple[str, ...]) -> CsvLayout:
    where = {name: names.index(name) for name in REQUIRED}

    def check(fields: list[str]) -> str | None:
        return (field_count(fields, names)
                or int_field("userId", fields[where["userId"]])
                or int_field("movieId", fields[where["movieId"]])
                or number_field("rating", fields[where["rating"]], MIN_RATING, MAX_RATING))

    types = {"userId": pa.int64(), "movieId": pa.int64(), "rating": pa.float64()}
    return CsvLayout(names=names, types=types, check=check)


def read_ratings_csv(file: DataFile) -> RawInteractions:
    """Read one MovieLens ratings file (fast path: pyarrow; errors name line and column)."""
    layout = _layout(read_header(file))
    table = read_checked(file, layout)
    if has_nulls(table, list(REQUIRED)):
        raise locate_error(file, layout, "empty values")
    rating = column(table, "rating", np.float64)
    if not ((rating >= MIN_RATING) & (rating <= MAX_RATING)).all():
        raise locate_error(file, layout, f"ratings outside {MIN_RATING}..{MAX_RATING}")
    return RawInteractions(user_id=column(table, "userId", np.int64),
                           item_id=column(table, "movieId", np.int64),
                           value=rating, kind="rating", files=(file.label,))
