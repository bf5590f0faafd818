"""Last.fm 360K: ``usersha1-artmbid-artname-plays.tsv`` (Celma, 2010).

Tab-separated, no header: user SHA-1, artist MusicBrainz id (may be empty), artist name,
play count. Users and items keep their raw string ids (user SHA-1, artist MBID); rows
without an MBID cannot name their item reliably (names collide) and are dropped and
counted. Artist names are never parsed (they hold quotes and stray bytes).
"""

from __future__ import annotations

from pathlib import PurePosixPath

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from vaecf.data.readers.archive import DataFile
from vaecf.data.readers.table import (
    CsvLayout,
    RawInteractions,
    column,
    field_count,
    has_nulls,
    int_field,
    locate_error,
    read_checked,
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


_IDS = pa.dictionary(pa.int32(), pa.string())  # one string per distinct id, not per row
LAYOUT = CsvLayout(names=NAMES, check=_check, delimiter="\t", header=False,
                   types={"user_sha1": _IDS, "artist_mbid": _IDS, "plays": pa.int64()})


def read_lastfm_file(file: DataFile) -> RawInteractions:
    """Read the play counts; ``value`` is the play count (implicit rule: plays >= N)."""
    table = read_checked(file, LAYOUT).unify_dictionaries()
    users = table["user_sha1"].combine_chunks()
    items = table["artist_mbid"].combine_chunks()
    if has_nulls(table, ["plays"]) or _equals(users, "").any():
        raise locate_error(file, LAYOUT, "empty values")
    plays = column(table, "plays", np.float64)
    if (plays < 0).any():
        raise locate_error(file, LAYOUT, "negative play counts")
    with_item = ~_equals(items, "")
    return RawInteractions(
        user_id=sorted_categorical(users)[with_item],
        item_id=sorted_categorical(items)[with_item],
        value=plays[with_item], kind="plays", files=(file.label,),
        counts={"rows_without_artist_mbid": int(len(plays) - with_item.sum())})


def _equals(ids: pa.DictionaryArray, value: str) -> np.ndarray:
    """(n,) bool: rows whose id is ``value``, compared once per distinct id."""
    return np.asarray(pc.equal(ids.dictionary, value).to_numpy(zero_copy_only=False))[
        ids.indices.to_numpy()]


def sorted_categorical(ids: pa.DictionaryArray) -> pd.Categorical:
    """Dictionary-encoded string ids as a Categorical whose categories are sorted.

    17.5 million Python strings per column would take gigabytes; the encoding keeps one
    string per distinct id (360K users, 160K artists) and an int32 code per row.
    """
    order = pc.sort_indices(ids.dictionary).to_numpy()
    rank = np.empty_like(order, dtype=np.int32)
    rank[order] = np.arange(len(order), dtype=np.int32)
    categories = pd.Index(ids.dictionary.take(pa.array(order)).to_pylist(), dtype=object)
    return pd.Categorical.from_codes(rank[ids.indices.to_numpy()], categories=categories)
