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
    column,
    equals_text,
    field_count,
    has_nulls,
    int_field,
    locate_error,
    read_checked,
    sorted_categorical,
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


LAYOUT = CsvLayout(names=NAMES, check=_check, delimiter="\t", header=False,
                   types={"user_sha1": TEXT_IDS, "artist_mbid": TEXT_IDS, "plays": pa.int64()})


def read_lastfm_file(file: DataFile) -> RawInteractions:
    """Read the play counts; ``value`` is the play count (implicit rule: plays >= N)."""
    table = read_checked(file, LAYOUT).unify_dictionaries()
    users = table["user_sha1"].combine_chunks()
    items = table["artist_mbid"].combine_chunks()
    if has_nulls(table, ["plays"]) or equals_text(users, "").any():
        raise locate_error(file, LAYOUT, "empty values")
    plays = column(table, "plays", np.float64)
    if (plays < 0).any():
        raise locate_error(file, LAYOUT, "negative play counts")
    with_item = ~equals_text(items, "")
    return RawInteractions(
        user_id=sorted_categorical(users)[with_item],
        item_id=sorted_categorical(items)[with_item],
        value=plays[with_item], kind="plays", files=(file.label,),
        counts={"rows_without_artist_mbid": int(len(plays) - with_item.sum())})
