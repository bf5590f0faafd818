"""Netflix Prize ratings: per-movie ``mv_*.txt`` files or Kaggle's ``combined_data_*.txt``.

Both forms are blocks of ``MovieID:`` lines each followed by ``CustomerID,Rating,Date`` lines
(a per-movie file is one block, a combined file many). pyarrow parses the rating lines; the
``MovieID:`` lines come out through its invalid-row hook with their line numbers, and each
rating row gets the movie of the block it sits in by ``np.repeat`` over block lengths.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

import numpy as np
import pyarrow as pa

from vaecf.data.readers.archive import DataFile
from vaecf.data.readers.table import (
    CsvLayout,
    RawInteractions,
    Rows,
    checked_rows,
    column,
    field_count,
    has_nulls,
    int_field,
    number_field,
    raw_interactions,
    read_checked,
)
from vaecf.errors import VaecfError

NAMES = ("customer_id", "rating", "date")
_DATA_FILE = re.compile(r"(mv_\d+|combined_data_\d+)\.txt")
MOVIE_LINE = re.compile(r"(\d+):")


def is_netflix_file(path: str) -> bool:
    return _DATA_FILE.fullmatch(PurePosixPath(path).name) is not None


def _check(fields: list[str]) -> str | None:
    if len(fields) == 1 and MOVIE_LINE.fullmatch(fields[0]):
        return None
    return (field_count(fields, NAMES) or int_field("customer_id", fields[0])
            or int_field("rating", fields[1]) or number_field("rating", fields[1], 1, 5))


def _rows(table: pa.Table) -> Rows | None:
    """Customers' ratings in 1..5; the movie is the caller's."""
    if has_nulls(table, ["customer_id", "rating"]):
        return None
    rating = column(table, "rating", np.float64)
    if not ((rating >= 1) & (rating <= 5)).all():
        return None
    return Rows(column(table, "customer_id", np.int64), None, rating)


LAYOUT = CsvLayout(names=NAMES, types={"customer_id": pa.int64(), "rating": pa.int64()},
                   check=_check, rows=_rows, header=False, skip_empty_lines=False)


def no_movie_line(file: DataFile) -> VaecfError:
    """A file whose first line is a rating, not the movie it belongs to."""
    return VaecfError(f"{file.label}: line 1: expected a 'MovieID:' line")


def read_netflix_file(file: DataFile) -> RawInteractions:
    """Read one per-movie or combined file; item ids are the Netflix movie ids."""
    movies: list[tuple[int, int]] = []  # (line number, movie id) of each ``MovieID:`` line

    def on_invalid_row(row: Any) -> str:
        found = MOVIE_LINE.fullmatch(row.text)
        if found is None or row.number is None:
            return "error"
        movies.append((int(row.number), int(found.group(1))))
        return "skip"

    table = read_checked(file, LAYOUT, use_threads=False, invalid_row_handler=on_invalid_row)
    if not movies or movies[0][0] != 1:
        raise no_movie_line(file)
    rows = checked_rows(file, LAYOUT, table)
    lines = np.array([line for line, _ in movies], dtype=np.int64)
    lengths = np.empty(len(lines), dtype=np.int64)
    lengths[:-1] = np.diff(lines) - 1
    lengths[-1] = table.num_rows - lengths[:-1].sum()
    movie_ids = np.repeat(np.array([movie for _, movie in movies], dtype=np.int64), lengths)
    return raw_interactions(Rows(rows.user_id, movie_ids, rows.value), "rating", file.label)
