"""Per-dataset readers of native formats, all returning ``RawInteractions``.

``read_raw`` finds the data files among the downloaded files (inside archives too) and
reads them with the dataset's reader. Every reader is strict: an empty file, a header
without data, a missing column, a non-numeric id, a NaN or out-of-range value, a corrupt
archive, a cut last line or non-UTF-8 bytes stop with one error naming file, line, column.
``check_data_files`` refuses a download that lacks the files its reader needs, so
``vaecf download`` fails, not the stage after it. The ``table`` reader reads a user's own
Parquet or CSV files with the columns named at download (``TableColumns``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from vaecf import log
from vaecf.data.readers import lastfm, netflix, pinterest
from vaecf.data.readers.archive import DataFile, Match, find_data_files
from vaecf.data.readers.interactions_table import (
    EXPECTED,
    TableColumns,
    csv_layout,
    is_table_file,
    mixed_formats,
    read_table_file,
    table_format,
)
from vaecf.data.readers.lastfm import is_lastfm_file, read_lastfm_file
from vaecf.data.readers.movielens import (
    file_layout,
    is_ratings_file,
    probe_ratings,
    ratings_layout,
    read_ratings,
)
from vaecf.data.readers.netflix import is_netflix_file, read_netflix_file
from vaecf.data.readers.pinterest import (
    is_pinterest_file,
    missing_pinterest_file,
    read_pinterest_file,
)
from vaecf.data.readers.table import CsvLayout, RawInteractions
from vaecf.errors import VaecfError
from vaecf.io import storage

__all__ = ["KINDS", "READERS", "RawInteractions", "Reader", "TableColumns", "check_data_files",
           "concat_ids", "iter_raw", "layout_of", "read_raw", "text_layout"]


@dataclass(frozen=True)
class Reader:
    """How one family of datasets is found and read.

    Attributes:
      match: whether a file name or archive member path is one of its data files.
      read: parses one data file, yielding its rows in one or more blocks.
      expected: the data files' names, as messages and manifests name them.
      probe: given a data file's label and first line, raises VaecfError if that line
        cannot start one (checked at download; the reader checks every line later).
      archives: data files may sit in zips and tarballs, which are opened.
    """

    match: Match
    read: Callable[..., Iterator[RawInteractions]]
    expected: str
    probe: Callable[[str, bytes], None] | None = None
    archives: bool = True


def _whole(read: Callable[..., RawInteractions]) -> Callable[..., Iterator[RawInteractions]]:
    """A reader that parses a file at once, as one block."""
    def blocks(file: DataFile, **kwargs: object) -> Iterator[RawInteractions]:
        yield read(file, **kwargs)
    return blocks


READERS: dict[str, Reader] = {
    "movielens": Reader(is_ratings_file, read_ratings, "ratings.csv, ratings.dat or u.data",
                        probe_ratings),
    "netflix": Reader(is_netflix_file, _whole(read_netflix_file),
                      "mv_*.txt or combined_data_*.txt"),
    "lastfm": Reader(is_lastfm_file, _whole(read_lastfm_file),
                     "usersha1-artmbid-artname-plays.tsv"),
    "pinterest": Reader(is_pinterest_file, _whole(read_pinterest_file),
                        "pinterest-20.{train,test}.rating"),
    "table": Reader(is_table_file, _whole(read_table_file), EXPECTED, archives=False),
}


# The value rule of each reader's data (``RawInteractions.kind``); a table's is its columns'.
KINDS = {"movielens": "rating", "netflix": "rating", "lastfm": "plays", "pinterest": "implicit"}


def text_layout(reader: str, file: DataFile, columns: TableColumns | None) -> CsvLayout | None:
    """The layout a delimited data file is parsed with, after the checks its reader makes
    before parsing (an empty file, a header, Pinterest's first line); None for Parquet."""
    if reader == "table" and table_format(file.label) == "parquet":
        return None
    if storage.source_size(file.path) == 0:
        raise VaecfError(f"{file.label}: file is empty")
    if reader == "table":
        if columns is None:
            raise VaecfError(f"{file.label}: the table's columns are unknown (download it "
                             "again)")
        return csv_layout(file, columns)
    if reader == "movielens":
        return file_layout(file)
    if reader == "pinterest":
        return pinterest.file_layout(file)
    return netflix.LAYOUT if reader == "netflix" else lastfm.LAYOUT


def check_data_files(reader: str, labels: list[str], names: list[str], where: str) -> None:
    """Refuse data files (``labels``, found among ``names``) that ``reader`` cannot read.

    Args:
      where: what the message names first (the source or the download directory).
    """
    problem = None
    if not labels:
        problem = f"no {READERS[reader].expected} among {', '.join(sorted(names))}"
    elif reader == "movielens" and len(labels) > 1:
        problem = f"several MovieLens ratings files ({', '.join(labels)}); expected one"
    elif reader == "pinterest":
        problem = missing_pinterest_file(labels)
    elif reader == "table":
        problem = mixed_formats(labels)
    if problem:
        raise VaecfError(f"{where}: {problem}")


def layout_of(reader: str, labels: list[str]) -> str:
    """The layout the data files are in: MovieLens' file name, a table's format (``parquet``
    or ``csv``), else the reader's files."""
    if reader == "movielens":
        return str(ratings_layout(labels[0]))
    if reader == "table":
        return str(table_format(labels[0]))
    return READERS[reader].expected


def read_raw(reader: str, directory: Path, names: list[str], scratch: Path,
             columns: TableColumns | None = None) -> RawInteractions:
    """Every row of ``iter_raw``'s blocks, joined into one ``RawInteractions``."""
    return _concat(list(iter_raw(reader, directory, names, scratch, columns)))


def iter_raw(reader: str, directory: Path, names: list[str], scratch: Path,
             columns: TableColumns | None = None) -> Iterator[RawInteractions]:
    """Read every data file of a download directory with ``reader``, a block at a time
    (a file, or part of one), in file order: a consumer that keeps only what it needs of
    each block (``preprocess``'s positives) never holds the whole raw data.

    Args:
      reader: a key of ``READERS`` (the dataset registry names it).
      directory: the download directory; ``names`` its files, from its manifest.
      scratch: an empty directory for members extracted from archives.
      columns: for ``table``, the columns its download recorded.
    """
    found = READERS[reader]
    files = find_data_files(directory, names, found.match, scratch, found.archives)
    check_data_files(reader, [f.label for f in files], names, str(directory))
    read = partial(found.read, columns=columns) if reader == "table" else found.read
    bar = log.Progress(f"read {reader}", len(files), "files")
    for file in files:
        yield from read(file)
        if isinstance(file.path, Path) and file.path.is_relative_to(scratch):
            file.path.unlink()  # extracted copies can be large (Last.fm: 1.6 GB)
        bar.update(1)
    bar.close()


def _concat(parts: list[RawInteractions]) -> RawInteractions:
    if len(parts) == 1:
        return parts[0]
    counts: dict[str, int] = {}
    for part in parts:
        for key, value in part.counts.items():
            counts[key] = counts.get(key, 0) + value
    return RawInteractions(
        user_id=concat_ids([p.user_id for p in parts]),
        item_id=concat_ids([p.item_id for p in parts]),
        value=np.concatenate([p.value for p in parts]),
        kind=parts[0].kind, files=tuple(dict.fromkeys(f for p in parts for f in p.files)),
        counts=counts)


def concat_ids(parts: list[np.ndarray | pd.Categorical]) -> np.ndarray | pd.Categorical:
    """Ids of several blocks: text ids stay one Categorical (one string per distinct id)."""
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(p, pd.Categorical) for p in parts):
        return pd.api.types.union_categoricals(parts, sort_categories=True)
    return np.concatenate([np.asarray(p) for p in parts])
