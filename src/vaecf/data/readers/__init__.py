"""Per-dataset readers of native formats, all returning ``RawInteractions``.

``read_raw`` finds the data files among the downloaded files (inside archives too) and
reads them with the dataset's reader. Every reader is strict: an empty file, a header
without data, a missing column, a non-numeric id, a NaN or out-of-range value, a corrupt
archive, a cut last line or non-UTF-8 bytes stop with one error naming file, line, column.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from vaecf import log
from vaecf.data.readers.archive import DataFile, Match, find_data_files
from vaecf.data.readers.lastfm import is_lastfm_file, read_lastfm_file
from vaecf.data.readers.movielens import is_ratings_file, read_ratings_csv
from vaecf.data.readers.netflix import is_netflix_file, read_netflix_file
from vaecf.data.readers.pinterest import is_pinterest_file, read_pinterest_file
from vaecf.data.readers.table import RawInteractions
from vaecf.errors import VaecfError

__all__ = ["READERS", "RawInteractions", "read_raw"]

READERS: dict[str, tuple[Match, Callable[[DataFile], RawInteractions], str]] = {
    "movielens": (is_ratings_file, read_ratings_csv, "ratings.csv"),
    "netflix": (is_netflix_file, read_netflix_file, "mv_*.txt or combined_data_*.txt"),
    "lastfm": (is_lastfm_file, read_lastfm_file, "usersha1-artmbid-artname-plays.tsv"),
    "pinterest": (is_pinterest_file, read_pinterest_file, "pinterest-20.{train,test}.rating"),
}


def read_raw(reader: str, directory: Path, names: list[str], scratch: Path) -> RawInteractions:
    """Read every data file of a download directory with ``reader``.

    Args:
      reader: a key of ``READERS`` (the dataset registry names it).
      directory: the download directory; ``names`` its files, from its manifest.
      scratch: an empty directory for members extracted from archives.
    """
    match, read, expected = READERS[reader]
    files = find_data_files(directory, names, match, scratch)
    if not files:
        raise VaecfError(f"{directory}: no {expected} among {', '.join(sorted(names))}")
    if reader == "movielens" and len(files) > 1:
        raise VaecfError(f"{directory}: several ratings.csv files "
                         f"({', '.join(f.label for f in files)}); expected one")
    parts: list[RawInteractions] = []
    bar = log.Progress(f"read {reader}", len(files), "files")
    for file in files:
        parts.append(read(file))
        if file.path.is_relative_to(scratch):
            file.path.unlink()  # extracted copies can be large (Last.fm: 1.6 GB)
        bar.update(1)
    bar.close()
    return _concat(parts, reader)


def _concat(parts: list[RawInteractions], reader: str) -> RawInteractions:
    if len(parts) == 1:
        return parts[0]
    counts: dict[str, int] = {}
    for part in parts:
        for key, value in part.counts.items():
            counts[key] = counts.get(key, 0) + value
    return RawInteractions(
        user_id=np.concatenate([np.asarray(p.user_id) for p in parts]),
        item_id=np.concatenate([np.asarray(p.item_id) for p in parts]),
        value=np.concatenate([p.value for p in parts]),
        kind=parts[0].kind, files=tuple(f for p in parts for f in p.files), counts=counts)
