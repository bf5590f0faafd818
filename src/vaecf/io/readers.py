"""One bounded reader per file format vaecf reads: JSON, JSON lines, text, Parquet, NPZ, CSV.

Every file vaecf reads, its own or a user's, goes through one of these. Each reads at most
what the format needs (a JSON file at most ``limit`` bytes; never a device, a FIFO or
``/proc`` without end), decodes text as UTF-8, and turns every parse or type error into one
line naming the file (``VaecfError``), never a traceback. A file written by vaecf and edited
since is a user's file like any other: ``field`` checks the type of each value read from it.
"""

from __future__ import annotations

import json
import math
import os
import stat
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vaecf.errors import VaecfError

JSON_LIMIT = 64 * 1024 * 1024  # manifests, metrics, checkpoint meta (its train log): far less
TEXT_LIMIT = 4 * 1024 * 1024  # a template, a search space, a lease
JSONL_LIMIT = 256 * 1024 * 1024  # a train log of a long run, a tuning sweep's trials


# The longest raw id (UTF-8 bytes) any stage takes: the data stages refuse a longer one where
# ids enter, so no model holds an item that ``vaecf serve`` (which refuses longer ids in a
# request) could never be asked for. MBIDs are 36 bytes, SHA-1 hex 40.
MAX_ID_BYTES = 256


def long_id(ids: Any) -> tuple[str, int] | None:
    """The first id of ``ids`` (n,) longer than ``MAX_ID_BYTES`` in UTF-8, with its length in
    bytes; None when every one fits (integers always do)."""
    import numpy as np
    import pandas as pd

    values = np.asarray(ids)
    if values.dtype.kind in "biuf":
        return None
    chars = pd.Series(values, dtype=object, copy=False).str.len().to_numpy(dtype=float)
    for index in np.flatnonzero(chars > MAX_ID_BYTES // 4):  # 4 bytes per character at most
        size = len(str(values[index]).encode("utf-8", "surrogatepass"))
        if size > MAX_ID_BYTES:
            return str(values[index]), size
    return None


def check_ids(ids: Any, column: str, where: str) -> None:
    """Refuse, in one line, ids of ``column`` longer than ``MAX_ID_BYTES``."""
    found = long_id(ids)
    if found is not None:
        raise id_too_long(where, column, *found)


def id_too_long(where: str, column: str, text: str, size: int) -> VaecfError:
    """The one line refusing an id of ``size`` bytes (``MAX_ID_BYTES``), every engine's."""
    return VaecfError(f"{where}: {column} {text[:40]!r}... is {size:,} bytes long (an id is "
                      f"at most {MAX_ID_BYTES} bytes of UTF-8: vaecf serve refuses longer ones)")


def read_bytes(path: Path, where: str | None = None, limit: int | None = None) -> bytes:
    """At most ``limit`` bytes of the regular file ``path``; a larger file is refused.

    Args:
      where: how the file is named in messages (an ``s3://`` key, a flag); default ``path``.
    """
    where = where or str(path)
    limit = JSON_LIMIT if limit is None else limit
    try:
        with open(path, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise VaecfError(f"{where}: not a regular file")
            data = handle.read(limit + 1)
    except OSError as err:
        raise VaecfError(f"{where}: cannot read ({err.strerror or err})") from None
    if len(data) > limit:
        raise VaecfError(f"{where}: larger than {limit:,} bytes; not read")
    return data


def decode(data: bytes, where: str) -> str:
    """``data`` as UTF-8 text, or one line saying where it is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise VaecfError(f"{where}: not UTF-8 text (byte {err.start}: "
                         f"{data[err.start:err.start + 1]!r})") from None


def read_text(path: Path, where: str | None = None, limit: int | None = None) -> str:
    """A UTF-8 text file of at most ``limit`` bytes (default ``TEXT_LIMIT``)."""
    return decode(read_bytes(path, where, TEXT_LIMIT if limit is None else limit),
                  where or str(path))


def parse_json(text: str | bytes, where: str, expect: type | None = dict) -> Any:
    """The JSON value of ``text``, of type ``expect`` (None: any)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise VaecfError(f"{where}: not valid JSON ({str(err)[:200]})") from None
    if expect is not None and not isinstance(value, expect):
        raise VaecfError(f"{where}: expected a JSON {_KINDS.get(expect, expect.__name__)}, "
                         f"found {_kind(value)}")
    return value


def read_json(path: Path, where: str | None = None, expect: type | None = dict,
              limit: int | None = None) -> Any:
    """The JSON value of the file ``path`` (at most ``limit`` bytes), of type ``expect``."""
    where = where or str(path)
    return parse_json(decode(read_bytes(path, where, limit), where), where, expect)


def read_jsonl(path: Path, where: str | None = None,
               limit: int | None = None) -> list[tuple[int, Any]]:
    """The JSON value of each non-blank line of ``path``, with its line number."""
    where = where or str(path)
    text = decode(read_bytes(path, where, JSONL_LIMIT if limit is None else limit), where)
    return [(number, parse_json(line, f"{where}: line {number}", expect=None))
            for number, line in enumerate(text.splitlines(), start=1) if line.strip()]


_KINDS: dict[Any, str] = {dict: "object", list: "array", str: "string", bool: "boolean",
                          int: "integer", float: "number", type(None): "null"}


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def field(mapping: Mapping[str, Any], key: str, where: str, kind: str) -> Any:
    """``mapping[key]`` checked to be a ``kind``: ``int`` (not a bool), ``number`` (finite),
    ``str``, ``dict``, ``list``, or any of them joined with ``|`` (``int|none``)."""
    value = mapping.get(key) if isinstance(mapping, Mapping) else None
    checks = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: (isinstance(v, int | float) and not isinstance(v, bool)
                                   and math.isfinite(v)),
              "str": lambda v: isinstance(v, str), "dict": lambda v: isinstance(v, dict),
              "list": lambda v: isinstance(v, list), "none": lambda v: v is None}
    if not any(checks[name](value) for name in kind.split("|")):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        missing = key not in mapping if isinstance(mapping, Mapping) else True
        found = "missing" if missing else f"{_kind(value)} {shown}"
        raise VaecfError(f"{where}: '{key}': expected {kind.replace('|', ' or ')}, "
                         f"found {found}")
    return value


# Parquet column kinds: what ``read_parquet`` accepts for a column.
IDS = "ids"  # raw ids: integers or text
RAW_IDS = "raw ids"  # a user's raw ids: integers, text, or integers written as floats
INDEX = "index"  # contiguous indices: integers
NUMBER = "number"  # integers or floats


@contextmanager
def _parquet_source(path: Path | str) -> Iterator[tuple[Any, bool]]:
    """What pyarrow opens, closed after the block: a local path, or an ``s3://`` object read
    in place by ranged GETs (a Spark engine's task reading its row groups); and whether
    pyarrow may read it with its own threads.

    The object, a Python file, is read on the calling thread only: Arrow's threads would take
    the GIL to read it, and one still holding it when the interpreter exits aborts the process
    (exit 134 after the work is done: 80 of 400 runs of a two-column read under load, a
    scratch script); a local path reads natively, threads and all.
    """
    from vaecf.io import storage

    if not (isinstance(path, str) and storage.is_s3(path)):
        yield Path(path), True
        return
    with storage.open_source(path) as handle:
        yield handle, False


def read_parquet(path: Path | str, columns: Mapping[str, str], where: str | None = None, *,
                 row_groups: Sequence[int] | None = None,
                 group_rows: Sequence[int] | None = None) -> Any:
    """The ``columns`` of a Parquet file as a ``pyarrow.Table``, each of its kind.

    Args:
      columns: column name -> ``IDS``, ``INDEX`` or ``NUMBER``; a missing column, or one
        of another type (a list, a struct, a float where ids are), is one line.
      row_groups: read only these row groups (in this order), e.g. one rank's share of a
        split's training pairs; the other groups' pages are never read. None: the whole file.
      group_rows: the rows of every row group of the file, as its writer listed them (a
        manifest): a file whose row groups differ is refused before anything is read.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = where or str(path)
    try:
        with _parquet_source(path) as (source, threads), pq.ParquetFile(source) as parquet:
            _check_schema(parquet.schema_arrow, columns, where)
            found = [parquet.metadata.row_group(g).num_rows
                     for g in range(parquet.metadata.num_row_groups)]
            if group_rows is not None and found != list(group_rows):
                raise VaecfError(f"{where}: row groups of {found[:5]}... rows, not the "
                                 f"{list(group_rows)[:5]}... its manifest lists")
            if row_groups is None:
                return parquet.read(columns=list(columns), use_threads=threads)
            outside = [g for g in row_groups if not 0 <= g < len(found)]
            if outside:
                raise VaecfError(f"{where}: no row group {outside[0]} (it has {len(found)})")
            return parquet.read_row_groups(list(row_groups), columns=list(columns),
                                           use_threads=threads)
    except (OSError, ValueError, KeyError, pa.ArrowException) as err:
        raise VaecfError(f"{where}: not a readable Parquet file ({str(err)[:200]})") from None


def parquet_rows(path: Path | str, columns: Mapping[str, str], where: str | None = None) -> int:
    """The number of rows of a Parquet file whose ``columns`` ``read_parquet`` would accept,
    read from its footer alone (no data page is read): for a check before the data is read,
    or read by an engine of its own (Spark)."""
    return sum(rows for rows, _ in parquet_groups(path, columns, where)[1])


def parquet_groups(path: Path | str, columns: Mapping[str, str], where: str | None = None
                   ) -> tuple[Any, list[tuple[int, int]]]:
    """The Arrow schema of a Parquet file whose ``columns`` ``read_parquet`` would accept,
    and (rows, compressed bytes) of each of its row groups, from its footer alone."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = where or str(path)
    try:
        with _parquet_source(path) as (source, _):
            metadata = pq.read_metadata(source)
        schema = metadata.schema.to_arrow_schema()
        _check_schema(schema, columns, where)
        groups = [metadata.row_group(g) for g in range(metadata.num_row_groups)]
        return schema, [(int(group.num_rows), sum(group.column(c).total_compressed_size
                                                  for c in range(group.num_columns)))
                        for group in groups]
    except (OSError, ValueError, KeyError, pa.ArrowException) as err:
        raise VaecfError(f"{where}: not a readable Parquet file ({str(err)[:200]})") from None


def _check_schema(schema: Any, columns: Mapping[str, str], where: str) -> None:
    missing = [name for name in columns if name not in schema.names]
    if missing:
        raise VaecfError(f"{where}: missing column(s) {', '.join(missing)} (found "
                         f"{', '.join(schema.names) or 'none'})")
    for name, kind in columns.items():
        _check_column(schema.field(name).type, name, kind, where)


def _check_column(kind_of: Any, name: str, kind: str, where: str) -> None:
    import pyarrow as pa

    text = pa.types.is_string(kind_of) or pa.types.is_large_string(kind_of)
    ok = {IDS: pa.types.is_integer(kind_of) or text,
          RAW_IDS: pa.types.is_integer(kind_of) or text or pa.types.is_floating(kind_of),
          INDEX: pa.types.is_integer(kind_of),
          NUMBER: pa.types.is_integer(kind_of) or pa.types.is_floating(kind_of)}[kind]
    if not ok:
        expected = {IDS: "integers or text", RAW_IDS: "integers, floats or text",
                    INDEX: "integers", NUMBER: "numbers"}[kind]
        raise VaecfError(f"{where}: column {name} holds {kind_of}, expected {expected}")


def read_npz_csr(path: Path, where: str | None = None) -> Any:
    """A ``scipy.sparse`` CSR matrix saved by ``save_npz`` (no pickles)."""
    import scipy.sparse as sp

    where = where or str(path)
    try:
        _check_npz_members(path, where)
        matrix = sp.load_npz(path)
        return matrix.tocsr()
    except (OSError, ValueError, KeyError, TypeError, EOFError, MemoryError,
            zipfile.BadZipFile) as err:
        raise VaecfError(f"{where}: not a readable CSR matrix ({str(err)[:200]})") from None


def _check_npz_members(path: Path, where: str) -> None:
    """Every array of the archive holds no more data than its member does, and no objects:
    a header edited to claim 10^12 elements is refused before anything is allocated."""
    import numpy as np

    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            with archive.open(info) as member:
                major, _ = np.lib.format.read_magic(member)
                header = (np.lib.format.read_array_header_1_0 if major == 1 else
                          np.lib.format.read_array_header_2_0)
                shape, _, dtype = header(member)
                claimed = math.prod(shape) * dtype.itemsize
                if dtype.hasobject or member.tell() + claimed > info.file_size:
                    raise VaecfError(f"{where}: {info.filename} declares {shape} {dtype}, "
                                     f"more than its {info.file_size:,} bytes hold")


def read_csv_text(path: Path, columns: tuple[str, ...], where: str | None = None) -> Any:
    """The ``columns`` of a UTF-8 CSV file as text, as a ``pandas.DataFrame``.

    Every field is text as written (``007`` is not ``7``, ``a<NUL>b`` is not ``a``); only an
    empty field is missing.
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    where = where or str(path)
    text = {c: pa.string() for c in columns}
    try:
        with pacsv.open_csv(path, convert_options=pacsv.ConvertOptions(
                column_types=text)) as reader:
            found = reader.schema.names
        missing = [c for c in columns if c not in found]
        if missing:
            raise VaecfError(f"{where}: missing column(s) {', '.join(missing)} (expected "
                             f"{','.join(columns)}; found {','.join(found)})")
        table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
            column_types=text, include_columns=list(columns), strings_can_be_null=True,
            null_values=[""], quoted_strings_can_be_null=True))
    except (OSError, ValueError, pa.ArrowException) as err:
        message = (str(err).splitlines() or [type(err).__name__])[0][:200]
        what = "not UTF-8 text" if "UTF8" in message else "not a readable CSV file"
        raise VaecfError(f"{where}: {what} ({message})") from None
    return table.to_pandas()
