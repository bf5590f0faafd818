"""A split's Parquet tables by row group, in either layout, and the reads that use them.

A table (``train``, ``val_fold_in``, ..., ``user_index``, ``item_index``) is one Parquet file
(``train.parquet``, whose row groups the manifest lists as ``train_row_groups``), or, where a
cluster's tasks wrote it (the Spark engine's ``s3://`` output), Parquet parts
``<table>/part-<n>.parquet`` that the manifest's ``parts`` lists, in order, each with its
rows, its first key and its row groups. Either way a reader sees one sequence of row groups,
each with its first key (user_idx; item_idx for ``item_index``) and rows, sorted by key: a
part is to the parts layout what a row group is to ``train.parquet``, and one reader
(``read_pairs``) picks the groups that hold a range of users, reads them, and checks them
against the listing. The listing comes from the manifest: no footer is opened to choose.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import scipy.sparse as sp

from vaecf.errors import VaecfError
from vaecf.io.bounds import COUNT  # user_idx and row counts: scipy's CSR, Parquet's row groups
from vaecf.io.manifest import require_listed
from vaecf.io.readers import INDEX, field, read_parquet

MANIFEST = "dataset_manifest.json"
ROW_GROUPS = "train_row_groups"
PART_FILES = "parts"  # the tables written as parts, as preprocess's manifest names its own
_PAIRS = {"user_idx": INDEX, "item_idx": INDEX}


@dataclass(frozen=True)
class RowGroups:
    """The row groups of one table, in row order: every file's groups, the files in order.

    Attributes:
      paths: the files (``train.parquet``, or the parts).
      file, index: int64 [groups]: each group's file (in ``paths``) and its index there.
      first, rows: int64 [groups]: each group's first key and its rows, as listed.
    """

    paths: list[Path]
    file: np.ndarray
    index: np.ndarray
    first: np.ndarray
    rows: np.ndarray

    def holding(self, keys: range) -> np.ndarray:
        """The groups that may hold rows of ``keys``: a key may straddle two groups (its
        rows end one group and start the next), so a group holds keys from its first to the
        next group's first, inclusive."""
        after = np.append(self.first[1:], np.iinfo(np.int64).max)
        return np.flatnonzero((self.first < keys.stop) & (after >= keys.start))

    def read(self, chosen: np.ndarray, columns: dict[str, str]) -> pa.Table:
        """The ``columns`` of the groups ``chosen`` (ascending), read file by file by the
        bounded reader; each file's groups must be those listed."""
        tables = []
        for f in np.unique(self.file[chosen]):
            own = chosen[self.file[chosen] == f]
            listed = self.rows[self.file == f].tolist()
            tables.append(read_parquet(self.paths[f], columns, row_groups=self.index[own].tolist(),
                                       group_rows=listed).select(list(columns)))
        return pa.concat_tables(tables) if tables else pa.table(
            {name: pa.array([], pa.int32()) for name in columns})

    def path_of(self, chosen: np.ndarray, row: int) -> Path:
        """The file of row ``row`` of what ``read(chosen)`` returned."""
        group = chosen[np.searchsorted(np.cumsum(self.rows[chosen]), row, side="right")]
        return self.paths[self.file[group]]


def listed(directory: Path, manifest: dict[str, Any], name: str) -> Path:
    """``directory / name``, which the manifest lists (and ``read_manifest`` verified)."""
    require_listed(manifest, "dataset", directory, [name])
    return directory / name


def part_entries(written: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The manifest's listing of a table's parts (``parts``), from what the tasks reported
    (``frames.parts_found``: ``{name: {"rows", "row_groups", ...}}``, in order)."""
    return [{"name": name, "rows": entry["rows"], "first": entry["row_groups"][0][0],
             "row_groups": entry["row_groups"]} for name, entry in written.items()]


def row_groups(directory: Path, manifest: dict[str, Any], table: str,
               rows: int) -> RowGroups | None:
    """The row groups of ``table``: of its parts (which must hold ``rows`` rows, as the
    manifest counts them), of ``train.parquet`` (``train_row_groups``), or None (a file
    read whole)."""
    where = f"{directory}/{MANIFEST}"
    if PART_FILES in manifest:
        found = _parts(directory, manifest, f"{table}.parquet", where)
        held = sum(int(groups[:, 1].sum()) for _, groups in found)
        if held != rows:
            raise VaecfError(f"{where}: '{PART_FILES}': {table}.parquet: its parts hold "
                             f"{held:,} rows, its counts {rows:,}")
    elif table == "train" and ROW_GROUPS in manifest:
        found = [(listed(directory, manifest, "train.parquet"),
                  _pairs(field(manifest, ROW_GROUPS, where, "list"), f"{where}: '{ROW_GROUPS}'"))]
    else:
        return None
    groups = [g for _, g in found]
    every = np.concatenate(groups) if groups else np.zeros((0, 2), np.int64)
    return RowGroups(paths=[path for path, _ in found],
                     file=np.repeat(np.arange(len(groups)), [len(g) for g in groups]),
                     index=np.concatenate([np.arange(len(g), dtype=np.int64) for g in groups]
                                          or [np.zeros(0, np.int64)]),
                     first=every[:, 0], rows=every[:, 1])


def _parts(directory: Path, manifest: dict[str, Any], file: str, where: str
           ) -> list[tuple[Path, np.ndarray]]:
    """Each part of ``file`` and its row groups ([first key, rows], int64 [groups, 2]), as
    ``parts`` lists them: listed files, in key order."""
    at = f"{where}: '{PART_FILES}': {file}"
    entries = field(field(manifest, PART_FILES, where, "dict"), file, f"{where}: '{PART_FILES}'",
                    "list")
    found: list[tuple[Path, np.ndarray]] = []
    last = -1
    for entry in entries:
        name = field(entry, "name", at, "str")
        path = listed(directory, manifest, name)
        groups = _pairs(field(entry, "row_groups", f"{at}: {name}", "list"),
                        f"{at}: {name}: 'row_groups'")
        if (not len(groups) or field(entry, "rows", f"{at}: {name}", "int") != groups[:, 1].sum()
                or field(entry, "first", f"{at}: {name}", "int") != groups[0, 0]):
            raise VaecfError(f"{at}: {name}: its 'rows' and 'first' are not those of its "
                             "'row_groups'")
        if groups[0, 0] < last or (np.diff(groups[:, 0]) < 0).any():
            raise VaecfError(f"{at}: {name}: its row groups start before those listed ahead "
                             "of them: the parts overlap or are out of order")
        last = int(groups[-1, 0])
        found.append((path, groups))
    return found


def _pairs(groups: list[Any], where: str) -> np.ndarray:
    """``[first key, rows]`` of each row group, checked: int64 [groups, 2]."""
    if not all(isinstance(g, list) and len(g) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and low <= v <= COUNT
            for v, low in zip(g, (0, 1), strict=True))
            for g in groups):  # an edited 2**64 would overflow int64 below
        raise VaecfError(f"{where}: expected [first user_idx, rows] pairs of integers up to "
                         f"{COUNT} (rows from 1)")
    return np.array(groups, dtype=np.int64).reshape(-1, 2)


def read_pairs(groups: RowGroups, users: range, span: range,
               n_items: int) -> tuple[sp.csr_matrix, int]:
    """CSR [len(users), n_items], float32: the pairs of ``users`` alone, from the row groups
    that hold them, and the pairs read to find them. ``span``: the users the table may hold
    (its split's); row r is user ``users.start + r``."""
    chosen = np.arange(len(groups.first)) if users == span else groups.holding(users)
    table = groups.read(chosen, _PAIRS)
    user = table.column("user_idx").to_numpy().astype(np.int64)
    item = table.column("item_idx").to_numpy().astype(np.int64)
    outside = np.flatnonzero((item < 0) | (item >= n_items) | (user < span.start)
                             | (user >= span.stop))
    if outside.size:
        raise VaecfError(f"{groups.path_of(chosen, int(outside[0]))}: item_idx outside "
                         f"0..{n_items - 1} or user_idx outside {span.start}..{span.stop - 1}")
    starts = np.cumsum(groups.rows[chosen]) - groups.rows[chosen]  # each chosen group's first row
    wrong = np.flatnonzero(user[starts] != groups.first[chosen])
    step = np.diff(user)
    steps = np.flatnonzero(step < 0)
    if wrong.size or steps.size:
        row = int(min(starts[wrong[0]] if wrong.size else len(user), steps[0] + 1 if steps.size
                      else len(user)))
        raise VaecfError(f"{groups.path_of(chosen, row)}: its rows are not sorted by user_idx "
                         "from the first users the manifest lists for its row groups")
    repeats = np.flatnonzero((step == 0) & (np.diff(item) <= 0))
    del step
    if repeats.size:
        raise VaecfError(f"{groups.path_of(chosen, int(repeats[0]) + 1)}: a user's item_idx "
                         "are not in increasing order")
    low, high = np.searchsorted(user, [users.start, users.stop])
    indptr = np.searchsorted(user[low:high], np.arange(users.start, users.stop + 1))
    matrix = sp.csr_matrix((np.ones(high - low, np.float32),
                            item[low:high].astype(np.int32), indptr),
                           shape=(len(users), n_items))
    return matrix, len(user)


def read_index(directory: Path, manifest: dict[str, Any], table: str,
               columns: dict[str, str], rows: int) -> pa.Table:
    """``user_index`` or ``item_index`` (``rows`` rows): ``<table>.parquet``, or its parts
    in order, each part's keys starting where the manifest lists."""
    groups = row_groups(directory, manifest, table, rows)
    if groups is None:
        return read_parquet(listed(directory, manifest, f"{table}.parquet"), columns)
    every = np.arange(len(groups.first))
    found = groups.read(every, columns)
    key = found.column(0).to_numpy()
    starts = np.cumsum(groups.rows) - groups.rows
    wrong = np.flatnonzero(key[starts] != groups.first)
    if wrong.size:
        raise VaecfError(f"{groups.path_of(every, int(starts[wrong[0]]))}: its rows do not "
                         "start at the keys the manifest lists for its row groups")
    return found
