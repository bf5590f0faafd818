"""What a task of the Spark engine's reader does: parse pieces of data files with the pandas
engine's own parsers and checks.

A piece is a byte range of a delimited text file or a row group of a Parquet file. A task
opens its files itself with Python, a local path or an ``s3://`` object read in place by
ranged GETs (``vaecf.io.storage.open_source``; a name is never a pattern: no Hadoop glob),
parses them with pyarrow under the options of the pandas engine's whole-file read
(``csv_options``, ``read_parquet``), checks the values with the same ``CsvLayout.rows`` or
``parquet_problem``, and yields Arrow batches of (user_id, item_id, value) and, last, one
report of the piece: rows read, rows left out, and what is wrong. A row is accepted or
refused by the same code in both engines; the driver turns a report's fault into the pandas
engine's one line (``vaecf.data.spark.raw``).

Text: a piece owns the lines that start inside its byte range (Hadoop's rule for splits).
It skips the line in progress at its start (the previous piece's), and reads past its end
to finish its last line, so every line is read once whatever the split points. The lines go
to pyarrow in blocks of whole lines of about ``BLOCK`` bytes: memory per task is bounded by
the block, whatever the file's size.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from vaecf.data.readers.interactions_table import (
    TableColumns,
    parquet_block,
    parquet_kinds,
    parquet_problem,
)
from vaecf.data.readers.netflix import MOVIE_LINE
from vaecf.data.readers.table import MAX_HEADER, CsvLayout, Rows, csv_options
from vaecf.data.splits import save_parquet_batches
from vaecf.errors import VaecfError
from vaecf.io import storage
from vaecf.io.manifest import sha256_file, sha256_source
from vaecf.io.readers import read_parquet

BLOCK = 16 << 20  # = the pandas reader's pyarrow block: a longer line is an error in both
BOM = b"\xef\xbb\xbf"
STRUCTURE, VALUES, NO_MOVIE = 1, 2, 4  # a report's flags: pyarrow refused a line; ``rows``
# refused a value; Netflix ratings before the first ``MovieID:`` line
# A line that may be a Netflix ``MovieID:`` line (``\n`` or ``\r\n`` ends); MOVIE_LINE decides.
_MOVIE_CANDIDATE = re.compile(rb"^([^,\r\n]*):\r?$\n?", re.MULTILINE)


@dataclass(frozen=True)
class Piece:
    """One unit of a task's work.

    Attributes:
      file: the file's index among the reader's data files.
      path: the file, as the driver sees it.
      start, end: text: the byte range whose lines it owns; Parquet: the row group's first
        row in the file, and ``group`` its index.
      size: bytes, to pack pieces into tasks.
    """

    file: int
    path: str
    start: int
    end: int
    size: int
    group: int = -1


@dataclass(frozen=True)
class FileFormat:
    """How a task parses one data file: a text layout, or a table's Parquet columns."""

    label: str
    layout: CsvLayout | None = None
    columns: TableColumns | None = None
    netflix: bool = False


@dataclass
class Report:
    """What one piece found: rows parsed, rows left out, faults (``flags``), a Parquet
    fault as (check, row, what), or an error line of the bounded Parquet reader."""

    piece: int
    file: int
    rows: int = 0
    dropped: int = 0
    positives: int = 0
    others: int = 0
    flags: int = 0
    reason: str = ""
    problem: list[object] | None = None
    error: str | None = None


class LineTooLong(Exception):
    """A line longer than a block: refused, as the pandas reader refuses it."""


def line_blocks(handle: IO[bytes], start: int, end: int, header: bool,
                block: int = BLOCK) -> Iterator[bytes]:
    """The lines that start in ``[start, end)`` of an open file, in blocks of whole lines;
    the file's header line (``header``) and a leading byte-order mark are not data. Raises
    ``LineTooLong`` for a line longer than ``block``."""
    if start == 0:
        if header:
            handle.readline(MAX_HEADER + 1)  # read and checked by the driver
        elif handle.read(len(BOM)) != BOM:
            handle.seek(0)
    else:
        handle.seek(start - 1)  # the line in progress at start, if any, is the previous piece's
        if not handle.readline(block + 2).endswith(b"\n"):
            return  # the end of the file, or a line too long, which its piece reports
    position, pending = handle.tell(), b""  # the file offset of pending[0]
    while position < end:
        data = handle.read(block)
        pending += data
        last = end - 1 - position  # the piece's last line holds this byte of pending
        if last < len(pending) or not data:
            stop = pending.find(b"\n", last) if last < len(pending) else -1
            if stop >= 0 or not data:
                tail = pending[:stop + 1] if stop >= 0 else pending
                if tail:
                    yield tail
                return
        else:
            cut = pending.rfind(b"\n") + 1
            if cut:
                yield pending[:cut]
                position, pending = position + cut, pending[cut:]
        if len(pending) - pending.rfind(b"\n") - 1 > block:
            raise LineTooLong


def movie_blocks(blocks: Iterable[bytes]) -> Iterator[tuple[int | None, bytes]]:
    """Netflix: the rating lines of ``blocks`` (a whole file's, in order), cut at each
    ``MovieID:`` line, with the movie they belong to (None before the first).

    Correct whatever the blocks: a block ends at a line end, so a ``MovieID:`` line is never
    cut, and the current movie is carried from one block to the next; a file is one piece,
    read in order by one task, so no block starts without its movie known. A line is a
    movie's if the pandas reader's ``MOVIE_LINE`` takes it whole.
    """
    movie: int | None = None
    for block in blocks:
        at = 0
        for found in _MOVIE_CANDIDATE.finditer(block):
            try:
                line = MOVIE_LINE.fullmatch(found.group(0).rstrip(b"\r\n").decode())
            except UnicodeDecodeError:
                line = None
            if line is None:
                continue  # not a movie's line: pyarrow refuses it among the ratings
            if found.start() > at:
                yield movie, block[at:found.start()]
            movie, at = int(line.group(1)), found.end()
        if at < len(block):
            yield movie, block[at:]


def _parse(data: bytes, layout: CsvLayout) -> pa.Table:
    """A block of lines parsed as the pandas engine parses a whole file (pyarrow's error if
    it refuses a line). A block that does not start the file cannot start with a byte-order
    mark, which pyarrow would drop there: its line is kept whole (after an empty line where
    empty lines are skipped, else refused: an id or ``MovieID:`` line holding one is bad)."""
    if data.startswith(BOM):
        if not layout.skip_empty_lines:
            raise pa.ArrowInvalid("a line starts with a byte-order mark")
        data = b"\n" + data
    return pacsv.read_csv(pa.py_buffer(data), **csv_options(layout, False, False))


def _text_rows(piece: Piece, form: FileFormat, report: Report
               ) -> Iterator[tuple[Rows, int | None]]:
    """The checked rows of a text piece, with their Netflix movie. After a fault nothing
    more is yielded but the lines are still parsed: a line pyarrow refuses comes first in
    the pandas reader's order of faults, whatever was found before it."""
    assert form.layout is not None
    layout = form.layout
    with storage.open_source(piece.path) as handle:
        blocks = line_blocks(handle, piece.start, piece.end, layout.header)
        parts = movie_blocks(blocks) if form.netflix else ((None, b) for b in blocks)
        try:
            for movie, data in parts:
                table = _parse(data, layout)
                report.rows += table.num_rows
                if table.num_rows == 0 or report.flags:
                    continue
                rows = None if form.netflix and movie is None else layout.rows(table)
                if rows is None:
                    report.flags |= NO_MOVIE if form.netflix and movie is None else VALUES
                else:
                    report.dropped += rows.dropped
                    yield rows, movie
        except (LineTooLong, pa.ArrowException) as err:
            report.flags |= STRUCTURE
            report.reason = str(err).splitlines()[0][:200] if str(err) else "a line too long"


def _parquet_rows(piece: Piece, form: FileFormat, report: Report) -> Iterator[Rows]:
    assert form.columns is not None
    try:
        table = read_parquet(piece.path, parquet_kinds(form.columns), form.label,
                             row_groups=[piece.group])
    except VaecfError as err:
        report.error = str(err)
        return
    report.rows = table.num_rows
    problem = parquet_problem(table, form.columns, piece.start)
    if problem:
        report.problem = list(problem)
    elif table.num_rows:
        yield parquet_block(table, form.columns)


def _ids(values: np.ndarray | pa.DictionaryArray) -> pa.Array:
    if isinstance(values, pa.DictionaryArray):
        return values.dictionary_decode().cast(pa.string())
    return pa.array(values, pa.int64())


def with_store(environment: dict[str, str]) -> None:
    """A task's way to the object store: ``environment`` (``vaecf.io.storage.ENVIRONMENT``)
    is what a local master's driver passes on (its tasks run on its machine, as its
    children); on a cluster it is empty, and the executors use their own (the Secret the
    driver's pod has too: ``vaecf.k8s.sparkapp``). The driver never sends credentials over
    the network."""
    os.environ.update(environment)


# A reader's rows: a positive pair, and the distinct users, and items, of a block's other
# rows (read_pieces' kinds of rows, the first two of which it packs); a piece's report; rows
# packed (blob); a user id of one of every SAMPLE_STRIDE rows packed
POSITIVE, OTHER_USER, OTHER_ITEM, REPORT, PACKED, SAMPLE = range(6)


def read_pieces(batches: Iterable[pa.RecordBatch], pieces: list[Piece],
                forms: list[FileFormat], schema: pa.Schema, least: float | None,
                environment: dict[str, str]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function: the rows of the pieces named by ``batches`` (column
    ``piece``), as ``schema`` (kind, user_id, item_id, _report, blob): each block's positives
    (a value of ``least`` or more; every row if None) and its other rows' distinct users
    (``OTHER_USER``), ``packed_users`` as (kind, user_id, item_id), the raw counts' ids of
    the other rows, not the rows; each block's other rows' distinct items (``OTHER_ITEM``
    rows); each piece's report (a JSON text in ``_report``; null in the other rows)."""
    with_store(environment)
    rows_schema = pa.schema(list(schema)[:3])
    for batch in batches:
        for index in batch.column("piece").to_pylist():
            piece = pieces[index]
            form = forms[piece.file]
            report = Report(index, piece.file)
            found: Iterator[tuple[Rows, int | None]]
            if form.layout is None:
                found = ((rows, None) for rows in _parquet_rows(piece, form, report))
            else:
                found = _text_rows(piece, form, report)
            for rows, movie in found:
                n = len(rows.value)
                items = rows.item_id if movie is None else np.full(n, movie, np.int64)
                assert items is not None
                users, item_ids = _ids(rows.user_id), _ids(items)
                if least is None:
                    keep = None
                else:
                    keep = pa.array(np.asarray(rows.value) >= least)
                    users, others = users.filter(keep), users.filter(pc.invert(keep))
                    item_ids, other_items = item_ids.filter(keep), item_ids.filter(
                        pc.invert(keep))
                report.positives += len(users)
                report.others += n - len(users)
                block = [task_batch(rows_schema, kind=POSITIVE, user_id=users, item_id=item_ids)]
                if keep is not None and len(others):
                    block.append(task_batch(rows_schema, kind=OTHER_USER,
                                            user_id=pc.unique(others)))
                    yield task_batch(schema, kind=OTHER_ITEM, item_id=pc.unique(other_items))
                yield from packed_users(pa.Table.from_batches(block), schema)
            yield task_batch(schema, kind=REPORT, _report=[json.dumps(asdict(report))])


def read_parquet_pieces(batches: Iterable[pa.RecordBatch], pieces: list[Piece],
                        columns: dict[str, str], where: str, rows: pa.Schema,
                        schema: pa.Schema, environment: dict[str, str]
                        ) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function: the ``columns`` of the row groups named by ``batches``
    (column ``piece``), read by the bounded Parquet reader, ``packed_users`` as ``rows``
    (``columns``' types) in rows of ``schema``."""
    with_store(environment)
    for batch in batches:
        for index in batch.column("piece").to_pylist():
            piece = pieces[index]
            table = read_parquet(piece.path, columns, where, row_groups=[piece.group])
            yield from packed_users(table.select(list(columns)).cast(rows), schema)


DIGESTS = pa.schema([("name", pa.string()), ("sha256", pa.string()), ("bytes", pa.int64())])


def file_digests(batches: Iterable[pa.RecordBatch], uri: str, environment: dict[str, str]
                 ) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function: (name, SHA-256, bytes) of the files below ``uri`` named by
    ``batches`` (column ``name``), each streamed by the task from where it lies."""
    with_store(environment)
    for batch in batches:
        for name in batch.column("name").to_pylist():
            digest, size = sha256_source(f"{uri.rstrip('/')}/{name}")
            yield pa.RecordBatch.from_arrays(
                [pa.array([name]), pa.array([digest]), pa.array([size], pa.int64())],
                schema=DIGESTS)


PARTS = pa.schema([("partition", pa.int32()), ("name", pa.string()), ("sha256", pa.string()),
                   ("bytes", pa.int64()), ("rows", pa.int64()), ("row_groups", pa.string())])


def partition_id() -> int:
    """The partition a task computes (0 outside Spark)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def task_batch(schema: pa.Schema, **columns: Any) -> pa.RecordBatch:
    """A batch of ``schema`` from ``columns`` (arrays, or one value repeated over the
    arrays' length); the columns not given are null."""
    count = max((len(v) for v in columns.values() if not np.isscalar(v)), default=1)

    def column(field: pa.Field) -> pa.Array:
        value = columns.get(field.name)
        if value is None:
            return pa.nulls(count, field.type)
        if isinstance(value, pa.Array):
            return value.cast(field.type)
        return pa.array(np.full(count, value) if np.isscalar(value) else value, field.type)

    return pa.RecordBatch.from_arrays([column(f) for f in schema], schema=schema)


# Rows of a partition's pairs in one packed value: 4M pairs of two longs (64 MiB before
# compression), far from a binary value's 2 GiB offsets
PACKED_ROWS = 1 << 22
# Arrow IPC buffers compressed (zstd, level 1): the JVM copies, caches and shuffles a packed
# value's bytes, fewer of them so. Chosen by a scratch run whose CPU counter missed the
# Python workers (docs: Results, data stages): the trade against no compression was not
# measured properly.
_PACKING = pa.ipc.IpcWriteOptions(compression="zstd")
# One user id of every SAMPLE_STRIDE rows packed by a reader goes to the driver, which cuts
# the users into ranges of about equal rows (``ranged``): ~1,000 samples a range of
# ``frames.ROWS_PER_PARTITION`` rows (Spark's RangePartitioner samples about 60 a partition);
# the driver holds them while it cuts: 500,000 ids at 1 billion rows.
SAMPLE_STRIDE = 2_000


def packed(table: pa.Table, schema: pa.Schema, **columns: Any) -> Iterator[pa.RecordBatch]:
    """``table`` as rows of ``schema`` whose ``blob`` column holds it as Arrow IPC streams
    (``PACKED_ROWS`` rows each; the other ``columns`` as ``task_batch`` takes them): what a
    persisted frame or a shuffle carries of a task's pairs, so that the next pass hands
    them to Python whole, without the JVM converting each row."""
    for start in range(0, table.num_rows, PACKED_ROWS):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema, options=_PACKING) as writer:
            writer.write_table(table.slice(start, PACKED_ROWS))
        data = sink.getvalue()
        offsets = pa.array([0, data.size], pa.int32()).buffers()[1]
        yield task_batch(schema, blob=pa.Array.from_buffers(pa.binary(), 1, [None, offsets, data]),
                         **columns)


def unpacked(batches: Iterable[pa.RecordBatch]) -> pa.Table | None:
    """The table ``packed`` packed in the ``blob`` column of ``batches`` (the rows of one
    task, in order), or None for none."""
    tables = [table for batch in batches for value in batch.column("blob")
              if (table := _unpacked_value(value)).num_rows]
    return pa.concat_tables(tables) if tables else None


def _unpacked_value(value: pa.BinaryScalar) -> pa.Table:
    """The table one ``packed`` value holds."""
    return pa.ipc.open_stream(value.as_buffer()).read_all()


def packed_users(table: pa.Table, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """A reader's rows ``table`` (with a ``user_id`` column) ``packed`` (``PACKED`` rows of
    ``schema``), and the user id of one of every ``SAMPLE_STRIDE`` of them (``SAMPLE``
    rows), from which the driver cuts the users into ranges (``frames.by_user``)."""
    if not table.num_rows:
        return
    yield from packed(table, schema, kind=PACKED)
    sample = table.column("user_id").take(pa.array(range(0, table.num_rows, SAMPLE_STRIDE)))
    yield task_batch(schema, kind=SAMPLE, user_id=sample)


# ranged's rows: the rows of a range of users packed (blob), for the partition that the
# hash partitioning of ``key`` sends them to
RANGED = pa.schema([("key", pa.int64()), ("blob", pa.binary())])


def ranged(batches: Iterable[pa.RecordBatch], bounds: np.ndarray, keys: list[int]
           ) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function: the rows ``packed`` in ``batches``, cut into ranges of
    users: range ``j`` holds the users after ``bounds[j - 1]`` up to ``bounds[j]`` (sorted
    ids, ``len(keys) - 1`` of them), each range's rows packed with ``keys[j]`` as ``RANGED``
    rows (``PACKED_ROWS`` rows of the task at a time; the rows of a range keep their
    order)."""
    held: list[pa.Table] = []
    rows = 0
    for batch in batches:
        for value in batch.column("blob"):
            held.append(_unpacked_value(value))
            rows += held[-1].num_rows
            if rows >= PACKED_ROWS:
                yield from _cut(pa.concat_tables(held), bounds, keys)
                held, rows = [], 0
    if rows:
        yield from _cut(pa.concat_tables(held), bounds, keys)


def _cut(table: pa.Table, bounds: np.ndarray, keys: list[int]) -> Iterator[pa.RecordBatch]:
    """``table``'s rows, range by range (``ranged``), each range's packed under its key."""
    codes, users = factorized(table.column("user_id"))
    ranges = np.searchsorted(bounds, users, side="left")[codes]
    if np.any(ranges[1:] < ranges[:-1]):  # else in order already (a file sorted by user)
        order = np.argsort(ranges, kind="stable")
        table, ranges = table.take(order), ranges[order]
    starts = np.searchsorted(ranges, np.arange(len(keys) + 1))
    for j in np.flatnonzero(np.diff(starts)):
        yield from packed(table.slice(starts[j], starts[j + 1] - starts[j]), RANGED,
                          key=keys[j])


def factorized(values: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize(values, sort=True)`` of an id column: (n,) int64 codes into its
    distinct values, sorted (numbers; text by code point, the byte order of UTF-8), and those
    values. Text is encoded by Arrow: a Python string is made for each distinct id, not for
    each row."""
    if not pa.types.is_string(values.type):
        codes, distinct = pd.factorize(values.to_numpy(), sort=True)
        return codes.astype(np.int64, copy=False), np.asarray(distinct)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    encoded = pc.dictionary_encode(values)
    order = pc.array_sort_indices(encoded.dictionary).to_numpy()
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return (rank[encoded.indices.to_numpy()],
            encoded.dictionary.take(order).to_numpy(zero_copy_only=False))


def gathered(batches: Iterable[pa.RecordBatch], keys: list[int]) -> pa.Table | None:
    """The rows ``ranged`` sent to this task (its partition's range of users, every row of
    them), or None for none. Raises if a row's key is not this partition's: the shuffle
    placed it elsewhere than ``frames.partition_keys`` found (then users would be split)."""
    held = []
    key = keys[partition_id()]
    for batch in batches:
        if pc.any(pc.not_equal(batch.column("key"), key)).as_py():
            raise RuntimeError(f"partition {partition_id()} received rows of another range "
                               "of users: Spark's hash partitioning differs from "
                               "frames.partition_keys'")
        held.append(batch)
    return unpacked(held)


def store_part(batches: Iterable[pa.RecordBatch], uri: str, part: str, schema: pa.Schema,
               group_rows: int) -> tuple[str, str, int, int, str] | None:
    """``batches`` written as the part ``<uri>/<part>`` (``save_parquet_batches``, the
    pandas engine's options, row groups of ``group_rows`` rows) through a file of the
    executor's own temporary folder, uploaded to an ``s3://`` ``uri`` or moved into a local
    one: (part, SHA-256, bytes, rows, row groups), or None for no rows. ``row_groups``: JSON
    ``[[first value of the first column, rows], ...]`` of each row group (a split's manifest
    lists them, so that a reader picks the groups that hold its users without opening a
    footer)."""
    with tempfile.TemporaryDirectory(prefix="vaecf-part-") as folder:
        path = Path(folder) / "part.parquet"
        rows, firsts = 0, []
        for batch in save_parquet_batches(path, schema, batches, group_rows):
            # the groups that start in this batch: rows group_rows * k of the part
            starts = range(-(-rows // group_rows) * group_rows, rows + batch.num_rows, group_rows)
            firsts += [batch.column(0)[start - rows].as_py() for start in starts]
            rows += batch.num_rows
        if not rows:
            return None
        groups = [[first, min(group_rows, rows - k * group_rows)]
                  for k, first in enumerate(firsts)]
        digest, size = sha256_file(path), path.stat().st_size
        if storage.is_s3(uri):
            storage.upload_file(path, f"{uri.rstrip('/')}/{part}")
        else:
            (Path(uri) / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(path, Path(uri) / part)
    return part, digest, size, rows, json.dumps(groups)
