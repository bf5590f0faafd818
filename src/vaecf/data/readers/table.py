"""Fast, strict reading of delimited text: pyarrow first, a line-by-line pass to name errors.

The fast path parses with pyarrow's CSV reader (explicit column types, multi-threaded) and
checks values with vectorised numpy. Only when something is wrong does the slow path re-read
the file line by line with the same rules, so the error can name the file, the 1-based line
and the column, e.g. ``ratings.csv: line 7: column 'rating': '7.0' is not in 0.5..5.0``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from vaecf.data.readers.archive import DataFile
from vaecf.errors import VaecfError
from vaecf.io import storage

LineCheck = Callable[[list[str]], str | None]
RowsOf = Callable[[pa.Table], "Rows | None"]
# pyarrow parses in blocks and fails on a line longer than about two of them ("straddling
# object"); locate_error calls any line longer than one block an error, naming it.
_BLOCK_SIZE = 16 << 20
_PIECE_SIZE = 2 * _BLOCK_SIZE  # two blocks: both cores parse
_INT64 = (-(2**63), 2**63 - 1)
MAX_HEADER = 64 << 10
TEXT_IDS = pa.dictionary(pa.int32(), pa.string())  # one string per distinct id, not per row


@dataclass(frozen=True)
class RawInteractions:
    """What a reader returns: one row per (user, item, value) line of the raw data.

    Attributes:
      user_id, item_id: raw ids, (n,) int64, or a Categorical of strings (Last.fm).
      value: (n,) float64 rating in stars, play count, or 1 for implicit datasets.
      kind: ``rating``, ``plays`` or ``implicit``: decides the implicit-conversion rule.
      files: labels of the files read, in order.
      counts: reader-level counts worth recording (e.g. Last.fm rows without an artist id).
    """

    user_id: np.ndarray | pd.Categorical
    item_id: np.ndarray | pd.Categorical
    value: np.ndarray
    kind: str
    files: tuple[str, ...]
    counts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Rows:
    """The interactions of one parsed table (a file, or a block of one), values checked.

    Attributes:
      user_id, item_id: int64 ids as numpy, or text ids dictionary-encoded (one string per
        distinct id); ``item_id`` None where the caller knows it (Netflix' movie).
      value: (n,) float64.
      dropped: rows left out and counted (Last.fm's rows without an artist id).
    """

    user_id: np.ndarray | pa.DictionaryArray
    item_id: np.ndarray | pa.DictionaryArray | None
    value: np.ndarray
    dropped: int = 0


@dataclass(frozen=True)
class CsvLayout:
    """How a file is laid out and what makes a line valid.

    Attributes:
      names: every column in file order.
      types: pyarrow types of the columns kept (the others are checked, not converted).
      delimiter: field separator (no quoting: none of these datasets quotes); pyarrow takes
        one character, so ``::`` (MovieLens' ``ratings.dat``) is read as ``:`` with empty
        columns between the fields, typed ``pa.null()`` so that anything in them is an error.
      separator: the separator ``check`` sees lines split by (``::``); default ``delimiter``.
      header: the first line is a header and is skipped.
      check: returns what is wrong with a line's fields (naming the column), or None.
      rows: the checked interactions of a parsed table, or None if a value is bad (the
        line pass then names the line, as ``check`` describes it).
      skip_empty_lines: blank lines are ignored (Netflix' reader needs exact line numbers).
      dropped: the count (in the manifest) of the rows ``rows`` leaves out, if it may.
    """

    names: tuple[str, ...]
    types: dict[str, pa.DataType]
    check: LineCheck
    rows: RowsOf
    delimiter: str = ","
    header: bool = True
    skip_empty_lines: bool = True
    separator: str = ""
    dropped: str = ""

    def split(self, line: str) -> list[str]:
        """A line's fields, as ``check`` takes them."""
        return line.split(self.separator or self.delimiter)


def csv_options(layout: CsvLayout, skip_header: bool, use_threads: bool = True,
                invalid_row_handler: Callable[[Any], str] | None = None) -> dict[str, Any]:
    """``pyarrow.csv.read_csv``'s options for ``layout``: every engine parses with these."""
    return {"read_options": pacsv.ReadOptions(column_names=list(layout.names),
                                              skip_rows=int(skip_header),
                                              use_threads=use_threads, block_size=_BLOCK_SIZE),
            "parse_options": pacsv.ParseOptions(delimiter=layout.delimiter, quote_char=False,
                                                ignore_empty_lines=layout.skip_empty_lines,
                                                invalid_row_handler=invalid_row_handler),
            # Only an empty field is null: "NA" or "null" in an id column is an error, not a gap.
            "convert_options": pacsv.ConvertOptions(column_types=layout.types,
                                                    include_columns=list(layout.types),
                                                    strings_can_be_null=False, null_values=[""])}


def read_checked(file: DataFile, layout: CsvLayout, use_threads: bool = True,
                 invalid_row_handler: Callable[[Any], str] | None = None) -> pa.Table:
    """Parse ``file`` into a table of ``layout.types`` columns; VaecfError names a bad line."""
    _check_not_empty(file)
    try:
        table = pacsv.read_csv(file.path, **csv_options(layout, layout.header, use_threads,
                                                        invalid_row_handler))
    except pa.ArrowInvalid as err:
        raise locate_error(file, layout, str(err)) from None
    if table.num_rows == 0:
        raise VaecfError(f"{file.label}: no data rows (header only?)")
    return table


def iter_checked(file: DataFile, layout: CsvLayout) -> Iterator[pa.Table]:
    """``read_checked`` a piece of about ``_PIECE_SIZE`` bytes (whole lines) at a time, each
    parsed as ``read_checked`` parses a file: the caller keeps what it needs of each piece,
    so the whole file's columns are never in memory at once. (pyarrow's streaming reader
    reads up to 32 blocks ahead of its consumer: 512 MiB of text at our block size.)"""
    _check_not_empty(file)
    skip, rows = layout.header, 0
    with storage.open_source(file.path) as handle:
        rest = b""
        while data := rest + handle.read(_PIECE_SIZE):
            cut = data.rfind(b"\n") + 1 if len(data) > len(rest) else len(data)
            if cut == 0:  # no line ends in the piece yet: read on (locate_error limits it)
                rest = data
                continue
            piece, rest = arrow_copy(memoryview(data)[:cut]), data[cut:]
            try:
                table = pacsv.read_csv(piece, **csv_options(layout, skip))
            except pa.ArrowInvalid as err:
                raise locate_error(file, layout, str(err)) from None
            skip = False
            rows += table.num_rows
            yield table
    if rows == 0:
        raise VaecfError(f"{file.label}: no data rows (header only?)")


def arrow_copy(data: memoryview) -> pa.Buffer:
    """``data`` copied into Arrow's memory, for pyarrow's threaded CSV reader.

    That reader drops its last reference to its input on one of Arrow's threads, possibly
    after ``read_csv`` has returned. A view of Python memory (``pa.py_buffer``) must then take
    the GIL on that thread, and if the interpreter is exiting by then, the thread is torn
    down inside a destructor: ``terminate called without an active exception``, exit 134,
    after the stage has finished (8 of 520 runs under load, and once in CI; apache/arrow#34314).
    Arrow's own memory is freed without Python.
    """
    sink = pa.BufferOutputStream()
    sink.write(data)
    return sink.getvalue()


def _check_not_empty(file: DataFile) -> None:
    if storage.source_size(file.path) == 0:
        raise VaecfError(f"{file.label}: file is empty")


def checked_rows(file: DataFile, layout: CsvLayout, table: pa.Table) -> Rows:
    """``layout.rows`` of ``file``'s table; a bad value is named by the line pass."""
    rows = layout.rows(table)
    if rows is None:
        raise locate_error(file, layout, "bad values")
    return rows


def read_rows(file: DataFile, layout: CsvLayout, kind: str) -> RawInteractions:
    """A whole delimited file read with ``layout``: its checked interactions."""
    rows = checked_rows(file, layout, read_checked(file, layout))
    return raw_interactions(rows, kind, file.label,
                            {layout.dropped: rows.dropped} if layout.dropped else {})


def raw_interactions(rows: Rows, kind: str, label: str,
                     counts: dict[str, int] | None = None) -> RawInteractions:
    """``rows`` of one file as ``RawInteractions`` (text ids as sorted Categoricals)."""
    def ids(values: np.ndarray | pa.DictionaryArray | None) -> np.ndarray | pd.Categorical:
        assert values is not None
        return sorted_categorical(values) if isinstance(values, pa.DictionaryArray) else values

    return RawInteractions(user_id=ids(rows.user_id), item_id=ids(rows.item_id),
                           value=rows.value, kind=kind, files=(label,), counts=counts or {})


def read_header_of(file: DataFile, required: tuple[str, ...]) -> tuple[str, ...]:
    """The column names of ``file``'s header, which must name every one of ``required``."""
    with storage.open_source(file.path) as handle:
        return header_names(file.label, handle.readline(MAX_HEADER + 1), required)


def header_names(label: str, first: bytes, required: tuple[str, ...]) -> tuple[str, ...]:
    """The column names of ``first``, a comma-separated header line read with a limit of
    ``MAX_HEADER`` bytes; each of ``required`` must appear, and no name twice."""
    if not first:
        raise VaecfError(f"{label}: file is empty")
    if len(first) > MAX_HEADER:
        raise VaecfError(f"{label}: line 1: header longer than {MAX_HEADER >> 10} KiB "
                         f"(expected one naming {','.join(required)})")
    try:
        # utf-8-sig: a byte-order mark (Excel writes one) is not part of the first name.
        # Quoted names ("userId") are accepted: some CSV writers quote the header only.
        names = tuple(n.strip('"') for n in first.decode("utf-8-sig").strip().split(","))
    except UnicodeDecodeError:
        raise VaecfError(f"{label}: line 1: header bytes are not UTF-8") from None
    header = ",".join(names)
    for name in required:
        if name not in names:
            raise VaecfError(f"{label}: line 1: missing column '{name}' "
                             f"(header is '{header}'; expected {', '.join(required)})")
    for name in names:
        if names.count(name) > 1:
            raise VaecfError(f"{label}: line 1: column '{name}' appears "
                             f"{names.count(name)} times (header is '{header}')")
    return names


def locate_error(file: DataFile, layout: CsvLayout, reason: str) -> VaecfError:
    """Re-read ``file`` line by line and describe its first bad line (slow; errors only)."""
    with storage.open_source(file.path) as handle:
        number = 0
        while raw := handle.readline(_BLOCK_SIZE + 1):
            number += 1
            if len(raw) > _BLOCK_SIZE:
                return VaecfError(f"{file.label}: line {number}: longer than "
                                  f"{_BLOCK_SIZE >> 20} MiB (missing line breaks?)")
            try:
                # utf-8-sig drops a byte-order mark, which pyarrow skips too.
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as err:
                return VaecfError(f"{file.label}: line {number}: bytes are not UTF-8 "
                                  f"(byte {err.start + 1} of the line)")
            text = text.rstrip("\r\n")
            if (layout.header and number == 1) or (not text and layout.skip_empty_lines):
                continue
            problem = layout.check(layout.split(text))
            if problem:
                cut = "" if raw.endswith(b"\n") else " (last line cut short: truncated file?)"
                return VaecfError(f"{file.label}: line {number}: {problem}{cut}")
    return VaecfError(f"{file.label}: cannot parse ({reason})")


def field_count(fields: list[str], names: tuple[str, ...]) -> str | None:
    if len(fields) != len(names):
        return f"expected {len(names)} fields ({', '.join(names)}), got {len(fields)}"
    return None


def int_field(name: str, raw: str) -> str | None:
    """An ASCII integer that fits in 64 bits (the type pyarrow reads ids into)."""
    digits = raw[1:] if raw.startswith("-") else raw
    if not (digits.isascii() and digits.isdigit()):
        return f"column '{name}': '{_shown(raw)}' is not an integer"
    if len(digits) > 19 or not _INT64[0] <= int(raw) <= _INT64[1]:
        return f"column '{name}': '{_shown(raw)}' does not fit in a 64-bit integer"
    return None


def _shown(raw: str) -> str:
    """A field as an error message quotes it: at most 40 characters."""
    return raw if len(raw) <= 40 else f"{raw[:40]}... ({len(raw):,} characters)"


def number_field(name: str, raw: str, low: float, high: float) -> str | None:
    """A finite number in [low, high] (NaN and empty are errors)."""
    try:
        value = float(raw)
    except ValueError:
        return f"column '{name}': '{_shown(raw)}' is not a number"
    if not low <= value <= high:  # also rejects NaN
        return f"column '{name}': '{_shown(raw)}' is not in {low:g}..{high:g}"
    return None


def column(table: pa.Table, name: str, dtype: type) -> np.ndarray:
    """A column as numpy; nulls must have been ruled out (they would raise here)."""
    return np.asarray(table.column(name).to_numpy(), dtype=dtype)


def has_nulls(table: pa.Table, names: list[str]) -> bool:
    return any(table.column(name).null_count for name in names)


def equals_text(ids: pa.DictionaryArray, value: str) -> np.ndarray:
    """(n,) bool: rows whose id is ``value``, compared once per distinct id."""
    return np.asarray(pc.equal(ids.dictionary, value).to_numpy(zero_copy_only=False))[
        ids.indices.to_numpy()]


def sorted_categorical(ids: pa.DictionaryArray) -> pd.Categorical:
    """Dictionary-encoded string ids as a Categorical whose categories are sorted.

    17.5 million Python strings per column would take gigabytes; the encoding keeps one
    string per distinct id (Last.fm: 360K users, 160K artists) and an int32 code per row.
    """
    order = pc.sort_indices(ids.dictionary).to_numpy()
    rank = np.empty_like(order, dtype=np.int32)
    rank[order] = np.arange(len(order), dtype=np.int32)
    categories = pd.Index(ids.dictionary.take(pa.array(order)).to_pylist(), dtype=object)
    return pd.Categorical.from_codes(rank[ids.indices.to_numpy()], categories=categories)
