"""Last.fm 360K: ``usersha1-artmbid-artname-plays.tsv`` (Celma, 2010).

Tab-separated, no header: user SHA-1, artist MusicBrainz id (may be empty), artist name,
play count. Users and items keep their raw string ids (user SHA-1, artist MBID); rows
without an MBID cannot name their item reliably (names collide) and are dropped and
counted. Artist names are never parsed (they hold quotes and stray bytes).
"""

from __future__ import annotations

from pathlib import PurePosixPath

import numpy as np
import pyarrow as pa

from vaecf.data.readers.archive import DataFile
from vaecf.data.readers.table import (
    TEXT_IDS,
    CsvLayout,
    RawInteractions,
    Rows,
    column,
    equals_text,
    field_count,
    has_nulls,
    int_field,
    read_rows,
)

NAMES = ("user_sha1", "artist_mbid", "artist_name", "plays")
FILE_NAME = "usersha1-artmbid-artname-plays.tsv"


def is_lastfm_file(path: str) -> bool:
    return PurePosixPath(path).name == FILE_NAME


def _check(fields: list[str]) -> str | None:
    problem = field_count(fields, NAMES)
    if problem is None and not fields[0]:
        problem = "column 'user_sha1': empty"
    if problem is None and (int_field("plays", fields[3]) or fields[3].startswith("-")):
        problem = f"column 'plays': '{fields[3]}' is not a play count (integer >= 0)"
    return problem


def _rows(table: pa.Table) -> Rows | None:
    """Play counts >= 0 of non-empty users; rows without an artist id left out."""
    table = table.unify_dictionaries()
    users = table["user_sha1"].combine_chunks()
    items = table["artist_mbid"].combine_chunks()
    if has_nulls(table, ["plays"]) or equals_text(users, "").any():
        return None
    plays = column(table, "plays", np.float64)
    if (plays < 0).any():
        return None
    with_item = ~equals_text(items, "")
    keep = pa.array(with_item)
    return Rows(users.filter(keep), items.filter(keep), plays[with_item],
                dropped=int(len(plays) - with_item.sum()))


LAYOUT = CsvLayout(names=NAMES, check=_check, rows=_rows, delimiter="\t", header=False,
                   types={"user_sha1": TEXT_IDS, "artist_mbid": TEXT_IDS, "plays": pa.int64()},
                   dropped="rows_without_artist_mbid")


def read_lastfm_file(file: DataFile) -> RawInteractions:
    """Read the play counts; ``value`` is the play count (implicit rule: plays >= N)."""
    return read_rows(file, LAYOUT, "plays")
