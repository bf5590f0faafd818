"""The ``table`` dataset: a user's own interaction log, Parquet or CSV, with named columns.

One row per interaction. The columns holding the user, the item and (optionally) a value are
named at download (``--user-column``, ``--item-column``, ``--value-column``, ``--value-kind``)
and recorded in ``download_manifest.json``: download refuses a file without them, as it refuses
a MovieLens file without ``userId``, and preprocess reads them from the manifest like any
other fact of the download. The value's rule is the existing vocabulary: ``rating`` (positive
if >= ``--min-rating``), ``plays`` (a count >= 0, positive if >= ``--min-plays``), or no value
column (``implicit``: every row is a positive).

Ids are text: ``007`` and ``7`` are two users. A Parquet integer id column is read as its
decimal text (``7`` -> ``"7"``), so one id written as an integer in one file and as text in
another is one id, and distinct texts are never merged. A dataset is one format, told by the
file names (``.parquet`` or ``.csv``); Parquet goes through the bounded Parquet reader, CSV
through the strict delimited reader (comma-separated, a header naming the columns, no quoted
fields). Archives are not opened: Parquet is compressed already.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vaecf.data.readers.archive import DataFile
from vaecf.data.readers.table import (
    TEXT_IDS,
    CsvLayout,
    RawInteractions,
    Rows,
    equals_text,
    field_count,
    has_nulls,
    header_names,
    int_field,
    raw_interactions,
    read_header_of,
    read_rows,
)
from vaecf.errors import VaecfError
from vaecf.io.paths import inside
from vaecf.io.readers import IDS, NUMBER, field, parquet_rows, read_parquet

FORMATS = {"parquet": ".parquet", "csv": ".csv"}
EXPECTED = "*.parquet or *.csv files"
VALUE_KINDS = ("rating", "plays")
IMPLICIT = "implicit"


@dataclass(frozen=True)
class TableColumns:
    """Which columns of a table hold what, and the rule for its value.

    Attributes:
      user, item: the columns of the user and item ids.
      value: the value's column, or None: every row is a positive.
      kind: ``rating``, ``plays``, or ``implicit`` when there is no value column
        (``RawInteractions.kind``: it decides the implicit-conversion rule).
    """

    user: str
    item: str
    value: str | None = None
    kind: str = IMPLICIT

    @property
    def names(self) -> tuple[str, ...]:
        return (self.user, self.item, *([self.value] if self.value else []))

    def record(self) -> dict[str, str | None]:
        """As the manifests record it (the flags' names, without dashes)."""
        return {"user_column": self.user, "item_column": self.item,
                "value_column": self.value, "value_kind": self.kind}


def table_columns(user: str | None, item: str | None, value: str | None = None,
                  kind: str | None = None) -> TableColumns:
    """The columns as ``vaecf download``'s flags name them, checked."""
    if not user or not item:
        raise VaecfError("--user-column and --item-column: required for dataset 'table' "
                         "(the names of the columns holding the user and item ids)")
    if value is not None and kind not in VALUE_KINDS:
        raise VaecfError(f"--value-kind: with --value-column, one of "
                         f"{', '.join(VALUE_KINDS)} (got {kind or 'none'})")
    if value is None and kind not in (None, IMPLICIT):
        raise VaecfError(f"--value-kind {kind}: needs --value-column (without one, every "
                         "row is a positive)")
    columns = TableColumns(user, item, value, kind or IMPLICIT)
    if len(set(columns.names)) < len(columns.names) or value == "":
        raise VaecfError("--user-column, --item-column, --value-column: distinct columns, "
                         f"got {', '.join(map(repr, columns.names))}")
    return columns


def recorded_columns(manifest: Mapping[str, object], where: str) -> TableColumns:
    """The columns ``vaecf download`` recorded in its manifest (``table``), checked again:
    the manifest is a file like any other once written."""
    entry = field(manifest, "table", where, "dict")
    at = f"{where}: table"
    return table_columns(field(entry, "user_column", at, "str"),
                         field(entry, "item_column", at, "str"),
                         field(entry, "value_column", at, "str|none"),
                         field(entry, "value_kind", at, "str"))


def table_format(name: str) -> str | None:
    """``parquet`` or ``csv``, by the file name's suffix; None for any other file."""
    return next((f for f, suffix in FORMATS.items() if name.endswith(suffix)), None)


def is_table_file(name: str) -> bool:
    return table_format(name) is not None


def mixed_formats(labels: list[str]) -> str | None:
    """What is wrong with a table's data files being of more than one format, or None."""
    first: dict[str | None, str] = {}
    for label in labels:
        first.setdefault(table_format(label), label)
    if len(first) < 2:
        return None
    return (f"mixed formats ({first['csv']} is CSV, {first['parquet']} is Parquet); a table "
            "dataset is of one format")


def probe_table(directory: Path, peeked: list[tuple[str, bytes]], columns: TableColumns,
                where: str) -> None:
    """Refuse data files that lack a named column or hold no rows, reading only a CSV's
    header line (``peeked``) and a Parquet file's footer; preprocess checks every row."""
    for label, first in peeked:
        path = inside(directory, label, where)
        if table_format(label) == "csv":
            header_names(label, first, columns.names)
            if path.stat().st_size <= len(first):
                raise VaecfError(f"{label}: no data rows (header only?)")
        elif parquet_rows(path, parquet_kinds(columns), label) == 0:
            raise VaecfError(f"{label}: no data rows")


def read_table_file(file: DataFile, columns: TableColumns | None = None) -> RawInteractions:
    """Read one data file of a ``table`` dataset; errors name the file and line or row."""
    if columns is None:
        raise VaecfError(f"{file.label}: the table's columns are unknown (download it again)")
    if table_format(file.label) == "csv":
        return read_rows(file, csv_layout(file, columns), columns.kind)
    table = read_parquet(file.path, parquet_kinds(columns), file.label)
    if table.num_rows == 0:
        raise VaecfError(f"{file.label}: no data rows")
    problem = parquet_problem(table, columns)
    if problem:
        raise VaecfError(f"{file.label}: row {problem[1] + 1}: {problem[2]}")
    return raw_interactions(parquet_block(table, columns), columns.kind, file.label)


def parquet_kinds(columns: TableColumns) -> dict[str, str]:
    return {columns.user: IDS, columns.item: IDS,
            **({columns.value: NUMBER} if columns.value else {})}


def parquet_problem(table: pa.Table, columns: TableColumns, first_row: int = 0
                    ) -> tuple[int, int, str] | None:
    """The first fault of Parquet rows (``first_row``: the file's row of the table's first),
    as (check, row, what): nulls in any named column, then empty ids, then bad values. Of
    the faults of a file's row groups, the lowest (check, row) is the whole file's first."""
    for check, name in enumerate(columns.names):
        values = table.column(name)
        if values.null_count:
            row = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
            return check, first_row + row, f"column '{name}': empty (null)"
    for check, name in enumerate((columns.user, columns.item), start=len(columns.names)):
        empty = np.flatnonzero(np.asarray(pc.equal(_as_text(table.column(name)), "")
                                          .to_numpy(zero_copy_only=False), dtype=bool))
        if len(empty):
            return check, first_row + int(empty[0]), f"column '{name}': empty"
    if columns.value is None:
        return None
    value = np.asarray(table.column(columns.value).to_numpy(), dtype=np.float64)
    bad = np.flatnonzero(~_valid_values(value, columns.kind))
    if len(bad):
        return (len(columns.names) + 2, first_row + int(bad[0]),
                f"column '{columns.value}': "
                f"{_value_problem(repr(float(value[bad[0]])), columns.kind)}")
    return None


def parquet_block(table: pa.Table, columns: TableColumns) -> Rows:
    """The interactions of Parquet rows without a fault (``parquet_problem``): ids as text."""
    ids = pa.table({name: pc.dictionary_encode(_as_text(table.column(name)))
                    for name in (columns.user, columns.item)}).unify_dictionaries()
    users, items = (ids.column(name).combine_chunks() for name in (columns.user, columns.item))
    if columns.value is None:
        return Rows(users, items, np.ones(table.num_rows))
    return Rows(users, items, np.asarray(table.column(columns.value).to_numpy(),
                                         dtype=np.float64))


def _as_text(ids: pa.ChunkedArray) -> pa.ChunkedArray:
    """Integer ids as their decimal text, text as it is."""
    return pc.cast(ids, pa.string()) if pa.types.is_integer(ids.type) else ids


def _valid_values(value: np.ndarray, kind: str) -> np.ndarray:
    """(n,) bool: finite numbers; play counts also whole and >= 0."""
    valid = np.isfinite(value)
    if kind == "plays":
        valid &= (value >= 0) & (value == np.floor(value))
    return valid


def _value_problem(shown: str, kind: str) -> str:
    return (f"{shown} is not a play count (an integer >= 0)" if kind == "plays" else
            f"{shown} is not a finite number")


def csv_layout(file: DataFile, columns: TableColumns) -> CsvLayout:
    """The layout of a CSV data file, by its header (which must name the columns)."""
    names = read_header_of(file, columns.names)
    where = {name: names.index(name) for name in columns.names}

    def check(fields: list[str]) -> str | None:
        problem = field_count(fields, names)
        if problem:
            return problem
        for name in (columns.user, columns.item):
            raw = fields[where[name]]
            if not raw:
                return f"column '{name}': empty"
            if '"' in raw:  # read as text, '"007"' would silently be another id than 007
                return (f"column '{name}': {raw[:40]!r} holds a quote (quoted fields are not "
                        "read: write the CSV without quoting)")
        if columns.value is not None:
            return _value_field(columns.value, fields[where[columns.value]], columns.kind)
        return None

    def rows(table: pa.Table) -> Rows | None:
        table = table.unify_dictionaries()
        users, items = (table[name].combine_chunks() for name in (columns.user, columns.item))
        if has_nulls(table, list(columns.names)) or any(
                equals_text(ids, "").any() or _holds_quote(ids) for ids in (users, items)):
            return None
        if columns.value is None:
            return Rows(users, items, np.ones(table.num_rows))
        value = np.asarray(table[columns.value].to_numpy(), dtype=np.float64)
        return Rows(users, items, value) if _valid_values(value, columns.kind).all() else None

    value_type = {"plays": pa.int64(), "rating": pa.float64()}.get(columns.kind)
    types = {columns.user: TEXT_IDS, columns.item: TEXT_IDS,
             **({columns.value: value_type} if columns.value and value_type else {})}
    return CsvLayout(names=names, types=types, check=check, rows=rows)


def _value_field(name: str, raw: str, kind: str) -> str | None:
    if kind == "plays":
        if int_field(name, raw) or raw.startswith("-"):
            return f"column '{name}': {_value_problem(repr(raw[:40]), kind)}"
        return None
    try:
        value = float(raw)
    except ValueError:
        return f"column '{name}': {raw[:40]!r} is not a number"
    return None if np.isfinite(value) else f"column '{name}': {_value_problem(repr(raw), kind)}"


def _holds_quote(ids: pa.DictionaryArray) -> bool:
    return bool(pc.any(pc.match_substring(ids.dictionary, '"')).as_py())
