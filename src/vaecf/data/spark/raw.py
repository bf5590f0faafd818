"""The raw rows of a download for ``--engine spark``: every layout the pandas engine reads.

The driver makes the checks the pandas reader makes before parsing (the data files there,
an empty file, a header, Pinterest's first line, a Parquet footer), cuts the files into
pieces, packs them into tasks of about ``spark.sql.files.maxPartitionBytes``' default and
parses them in the tasks with the pandas engine's own code (``pieces``). The parse is
persisted once: the pieces' reports come from it, and every later step reads it, not the
files. A file with a fault stops the stage with the pandas engine's line, found in the
order the pandas reader finds faults: files in order; in a text file a line pyarrow
refuses, no rows, a Netflix file not starting with its movie, a bad value, the line named
by the pandas engine's line pass (``locate_error``); in a Parquet file the first fault of
its row groups (``parquet_problem``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from vaecf.data.preprocess import FilterConfig, positive_threshold
from vaecf.data.readers import KINDS, TableColumns, check_data_files, text_layout
from vaecf.data.readers.archive import DataFile
from vaecf.data.readers.interactions_table import parquet_kinds
from vaecf.data.readers.netflix import no_movie_line
from vaecf.data.readers.table import locate_error
from vaecf.data.spark.pieces import (
    DIGESTS,
    NO_MOVIE,
    REPORT,
    STRUCTURE,
    VALUES,
    FileFormat,
    Piece,
    Report,
    file_digests,
    read_parquet_pieces,
    read_pieces,
)
from vaecf.errors import VaecfError
from vaecf.io import storage
from vaecf.io.readers import IDS, parquet_groups

# Spark's defaults for its own file reader: the most bytes a task reads
# (spark.sql.files.maxPartitionBytes) and what opening one more file costs (openCostInBytes).
MAX_TASK_BYTES = 128 << 20
OPEN_COST = 4 << 20
_REPORT = "_report"


@dataclass(frozen=True)
class RawFrame:
    """What the pandas engine's ``RawInteractions`` holds, as a DataFrame: the positives
    (the implicit rule applied by the tasks that parse), and the ids of the other rows.

    Attributes:
      rows: (kind, user_id, item_id, blob) of the parse: each block's positives and its
        other rows' distinct users packed (``pieces.packed_users``: ``PACKED`` and
        ``SAMPLE`` rows), its other rows' distinct items (``OTHER_ITEM`` rows); read from
        ``cached``.
      kind: ``rating``, ``plays`` or ``implicit``: the implicit rule.
      counts: the reader's own counts (Last.fm's rows without an artist id).
      read: the data rows read; ``positives``: those that are positives.
      cached: the persisted parse, to unpersist once ``rows`` is no longer read.
    """

    rows: DataFrame
    kind: str
    counts: dict[str, int]
    read: int
    positives: int
    cached: DataFrame


def read_raw(spark: SparkSession, reader: str, files: list[DataFile], names: list[str],
             where: str, config: FilterConfig, columns: TableColumns | None = None
             ) -> RawFrame:
    """The raw rows of a download's data files (sorted by label), read with ``reader``,
    their positives by ``config``'s rule."""
    check_data_files(reader, [f.label for f in files], names, where)
    forms: list[FileFormat] = []
    groups: list[list[tuple[int, int]]] = []
    late: VaecfError | None = None  # a fault found before parsing: the pandas reader meets it
    for file in files:                # only after reading the files before it
        try:
            layout = text_layout(reader, file, columns)
            if layout is None:
                assert columns is not None
                groups.append(parquet_groups(file.path, parquet_kinds(columns), file.label)[1])
                if not sum(rows for rows, _ in groups[-1]):
                    raise VaecfError(f"{file.label}: no data rows")
            else:
                groups.append([])
        except VaecfError as err:
            late = err
            break
        forms.append(FileFormat(file.label, layout, columns, netflix=reader == "netflix"))
    ids = pa.string() if reader in ("lastfm", "table") else pa.int64()  # text ids stay text
    arrow = pa.schema([("kind", pa.int8()), ("user_id", ids), ("item_id", ids),
                       (_REPORT, pa.string()), ("blob", pa.binary())])
    kind = columns.kind if reader == "table" and columns is not None else KINDS[reader]
    pieces, split = _pieces(files[:len(forms)], forms, groups,
                            spark.sparkContext.defaultParallelism)
    parsed = _task_frame(spark, _tasks(pieces, split)).mapInArrow(
        partial(read_pieces, pieces=pieces, forms=forms, schema=arrow,
                least=positive_threshold(kind, config), environment=task_environment(spark)),
        from_arrow_schema(arrow)).persist()
    try:
        found = [Report(**json.loads(row[0])) for row in
                 parsed.where(F.col(_REPORT).isNotNull()).select(_REPORT).collect()]
        left_out = _check(files, forms, found)
        if late is not None:
            raise late
    except BaseException:
        parsed.unpersist()
        raise
    layout = forms[0].layout if forms else None
    dropped = {layout.dropped: left_out} if layout is not None and layout.dropped else {}
    return RawFrame(parsed.where(F.col("kind") != REPORT).drop(_REPORT), kind, dropped,
                    sum(r.positives + r.others for r in found),
                    sum(r.positives for r in found), parsed)


def read_parquet_ids(spark: SparkSession, paths: list[Path | str], names: list[str],
                     where: str | None = None) -> tuple[DataFrame, int]:
    """The id columns ``names`` of Parquet files read one after the other (a file, or the
    parts a cluster's tasks wrote; integers as longs, text as strings), read by the bounded
    Parquet reader in tasks of row groups, local paths or ``s3://`` objects alike, packed
    (``pieces.packed_users``: rows (kind, ``names``, blob), the ids of ``SAMPLE`` rows in
    ``user_id``, which ``names`` holds); and their number of rows, from the files' footers
    (no pass over the rows)."""
    columns = dict.fromkeys(names, IDS)
    pieces: list[Piece] = []
    types = None
    rows = 0
    for index, path in enumerate(paths):
        found, groups = parquet_groups(path, columns, where or str(path))
        types = types or found
        rows += sum(n for n, _ in groups)
        pieces.extend(_row_groups(index, str(path), groups))
    assert types is not None, "no Parquet file to read"
    arrow = pa.schema([(name, pa.int64() if pa.types.is_integer(types.field(name).type)
                        else pa.string()) for name in columns])
    schema = pa.schema([("kind", pa.int8()), *arrow, ("blob", pa.binary())])
    split = _split_size(sum(p.size for p in pieces), spark.sparkContext.defaultParallelism)
    return _task_frame(spark, _tasks(pieces, split)).mapInArrow(
        partial(read_parquet_pieces, pieces=pieces, columns=columns,
                where=where or str(paths[0]), rows=arrow, schema=schema,
                environment=task_environment(spark)), from_arrow_schema(schema)), rows


def check_files(spark: SparkSession, uri: str, manifest: str, files: dict[str, dict]) -> None:
    """The SHA-256 of every file of a published ``s3://`` output that its manifest lists
    (``read_remote_manifest``), checked in tasks that stream the files where they lie (one
    file a task): nothing passes through the driver. The first mismatch is
    ``read_manifest``'s line."""
    names = sorted(files)
    if not names:
        return
    found = spark.createDataFrame([(name,) for name in names], "name string").repartition(
        len(names)).mapInArrow(partial(file_digests, uri=uri,
                                       environment=task_environment(spark)),
                               from_arrow_schema(DIGESTS))
    digests = {row["name"]: row["sha256"] for row in found.collect()}
    for name in names:
        if digests.get(name) != files[name]["sha256"]:
            raise VaecfError(f"{uri.rstrip('/')}/{name}: SHA-256 does not match {manifest}")


def local_master(spark: SparkSession) -> bool:
    """Whether the tasks run in this driver's machine (``local[*]``), seeing its files."""
    return str(spark.sparkContext.master).startswith("local")


def task_environment(spark: SparkSession) -> dict[str, str]:
    """What the tasks need to reach the object store from this driver: its
    ``storage.ENVIRONMENT`` under a local master (the tasks are its own children; a session
    started before the variables were set has Python workers without them), nothing on a
    cluster (``pieces.with_store``)."""
    return storage.environment() if local_master(spark) else {}


def share_files(spark: SparkSession, files: list[DataFile], scratch: str | None
                ) -> list[DataFile]:
    """``files`` where a cluster's tasks can read them: those only this driver holds (the
    members of an archive it extracted, a local input) put in ``scratch`` (the output's
    ``remote_scratch``) first, one after the other. Under a local master, or without a
    scratch prefix (a local output: a shared disk is assumed), ``files`` as they are."""
    if scratch is None or local_master(spark):
        return files
    shared = []
    for index, file in enumerate(files):
        if isinstance(file.path, Path):
            uri = f"{scratch}/{index}-{file.path.name}"
            storage.upload_file(file.path, uri)
            file = DataFile(file.label, uri)
        shared.append(file)
    return shared


def _task_frame(spark: SparkSession, tasks: list[list[int]]) -> DataFrame:
    """One partition per task, holding its pieces' indices (column ``piece``)."""
    return spark.createDataFrame(
        spark.sparkContext.parallelize(tasks, max(len(tasks), 1)).flatMap(
            lambda task: [(piece,) for piece in task]),
        T.StructType([T.StructField("piece", T.IntegerType())]))


def _pieces(files: list[DataFile], forms: list[FileFormat], groups: list[list[tuple[int, int]]],
            parallelism: int) -> tuple[list[Piece], int]:
    """Text files cut into byte ranges (a Netflix file whole: its lines need the movie line
    above them), Parquet files into row groups; and the bytes of a task (``_split_size``)."""
    sizes = [storage.source_size(f.path) for f in files]
    split = _split_size(sum(sizes), parallelism)
    pieces: list[Piece] = []
    for index, (file, form, size) in enumerate(zip(files, forms, sizes, strict=True)):
        path = str(file.path)
        if form.layout is None:
            pieces.extend(_row_groups(index, path, groups[index]))
        elif form.netflix:
            pieces.append(Piece(index, path, 0, size, size))
        else:
            pieces.extend(Piece(index, path, start, min(start + split, size),
                                min(split, size - start))
                          for start in range(0, size, split))
    return pieces, split


def _split_size(total: int, parallelism: int) -> int:
    """Spark's split size: ``total`` bytes spread over the cores, at least ``OPEN_COST``, at
    most ``MAX_TASK_BYTES``."""
    return min(MAX_TASK_BYTES, max(OPEN_COST, total // max(parallelism, 1)))


def _row_groups(file: int, path: str, groups: list[tuple[int, int]]) -> list[Piece]:
    """A Parquet file's pieces: its row groups, each with its first row in the file."""
    firsts = [0, *np.cumsum([rows for rows, _ in groups]).tolist()]
    return [Piece(file, path, firsts[group], firsts[group] + rows, compressed, group)
            for group, (rows, compressed) in enumerate(groups)]


def _tasks(pieces: list[Piece], split: int) -> list[list[int]]:
    """Consecutive pieces packed into tasks of at most ``split`` bytes (a piece larger than
    that alone), each piece counting ``OPEN_COST`` more, as Spark packs its splits."""
    tasks: list[list[int]] = []
    size = split
    for index, piece in enumerate(pieces):
        cost = piece.size + OPEN_COST
        if size + cost > split:
            tasks.append([])
            size = 0
        tasks[-1].append(index)
        size += cost
    return tasks


def _check(files: list[DataFile], forms: list[FileFormat], reports: list[Report]) -> int:
    """Raise the pandas engine's line for the first file with a fault; the rows left out."""
    by_file: dict[int, list[Report]] = {}
    for report in sorted(reports, key=lambda r: r.piece):
        by_file.setdefault(report.file, []).append(report)
    for index, form in enumerate(forms):
        file, found = files[index], by_file.get(index, [])
        errors = [r.error for r in found if r.error]
        if errors:
            raise VaecfError(errors[0])
        flags, rows = 0, sum(r.rows for r in found)
        for report in found:
            flags |= report.flags
        if form.layout is None:
            problems = [(int(check), int(row), str(what))  # type: ignore[call-overload]
                        for check, row, what in (r.problem for r in found if r.problem)]
            if problems:
                _, row, what = min(problems)
                raise VaecfError(f"{file.label}: row {row + 1}: {what}")
            continue
        if flags & STRUCTURE:
            raise locate_error(file, form.layout, next(r.reason for r in found if r.reason))
        if rows == 0:
            raise VaecfError(f"{file.label}: no data rows (header only?)")
        if flags & NO_MOVIE:
            raise no_movie_line(file)
        if flags & VALUES:
            raise locate_error(file, form.layout, "bad values")
    return sum(r.dropped for r in reports)
