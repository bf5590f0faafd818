"""Implicit conversion and filtering: raw ratings -> one row per positive (user_id, item_id).

Steps, each counted (rows, users, items) for the manifest: ``raw`` -> ``implicit`` (the
dataset's positive rule) -> ``dedup`` (a pair seen twice is one positive) -> ``item_filter``
(items with fewer than ``min_item_users`` users) -> ``user_filter`` (users with fewer than
``min_user_items`` items); with ``k_core`` the two filters repeat until nothing changes.

Counts are taken BY ID: ids are factorised once into codes and counted with
``np.bincount`` indexed by code. The reference notebook counted with ``groupby().size()``
and then indexed the result by position, which silently keeps the wrong users as soon as
ids are not 0..n-1 in sorted order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import pandas as pd
import pyarrow as pa

from vaecf.data.readers import RawInteractions, concat_ids
from vaecf.data.splits import PART_FILES, save_parquet
from vaecf.errors import VaecfError
from vaecf.io.readers import check_ids, field

Ids: TypeAlias = "np.ndarray | pd.Categorical"
PROTOCOLS = ("mission", "paper")
INTERACTIONS = "interactions.parquet"
# The folder of its parts (part-<n>.parquet), where the tasks of the Spark engine write them
# for an s3:// output; the manifest's ``parts`` lists them in order.
INTERACTIONS_PARTS = "interactions"
PARTS = PART_FILES  # the manifest's files written as parts by a cluster's tasks
# mission: DESIGN.md section 4; paper: Liang et al. 2018 (users >= 5, items not filtered).
PRESETS: dict[str, dict[str, int]] = {
    "mission": {"min_user_items": 5, "min_item_users": 5},
    "paper": {"min_user_items": 5, "min_item_users": 0},
}


@dataclass(frozen=True)
class FilterConfig:
    """The thresholds actually applied (recorded in the manifest).

    Attributes:
      min_rating: a rating is positive if >= this (4.0 on a half-star scale is "> 3.5").
      min_plays: a Last.fm play count is positive if >= this.
      min_item_users: items with fewer distinct users are dropped (0: no item filter).
      min_user_items: users with fewer distinct items are dropped.
      k_core: repeat the two filters until every remaining user and item passes.
    """

    protocol: str = "mission"
    min_rating: float = 4.0
    min_plays: int = 1
    min_item_users: int = 5
    min_user_items: int = 5
    k_core: bool = False


@dataclass(frozen=True)
class Interactions:
    """Positive pairs sorted by (user_id, item_id), the counts of every step and the files
    read."""

    user_id: np.ndarray
    item_id: np.ndarray
    counts: dict[str, Any]
    files: tuple[str, ...] = ()


def positive_threshold(kind: str, config: FilterConfig) -> float | None:
    """The least value of a positive under the dataset's rule (``kind``): None where every
    row is one."""
    return {"rating": config.min_rating, "plays": float(config.min_plays)}.get(kind)


def positive_mask(raw: RawInteractions, config: FilterConfig) -> np.ndarray:
    """(n,) bool: which raw rows are positives under the dataset's rule."""
    least = positive_threshold(raw.kind, config)
    if least is None:
        return np.ones(len(raw.value), dtype=bool)
    return np.asarray(raw.value >= least)


def _step(user_idx: np.ndarray, item_idx: np.ndarray, n_users: int,
          n_items: int) -> dict[str, int]:
    return {"rows": len(user_idx),
            "users": int(np.count_nonzero(np.bincount(user_idx, minlength=n_users))),
            "items": int(np.count_nonzero(np.bincount(item_idx, minlength=n_items)))}


def keep_frequent(codes: np.ndarray, size: int, minimum: int) -> np.ndarray:
    """(n,) bool: rows whose id (given as ``codes`` in 0..size-1) occurs >= ``minimum`` times.

    Counting is by id: ``np.bincount`` gives the count of code c at index c, and each row
    looks up the count of its own code.
    """
    return np.bincount(codes, minlength=size)[codes] >= minimum


def _filter(user_idx: np.ndarray, item_idx: np.ndarray, n_users: int, n_items: int,
            config: FilterConfig, counts: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Items first, then users; repeated until stable when ``config.k_core``."""
    rounds = 0
    while True:
        rounds += 1
        before = len(user_idx)
        if config.min_item_users > 0:
            keep = keep_frequent(item_idx, n_items, config.min_item_users)
            user_idx, item_idx = user_idx[keep], item_idx[keep]
        if rounds == 1:
            counts["item_filter"] = _step(user_idx, item_idx, n_users, n_items)
        keep = keep_frequent(user_idx, n_users, config.min_user_items)
        user_idx, item_idx = user_idx[keep], item_idx[keep]
        if rounds == 1:
            counts["user_filter"] = _step(user_idx, item_idx, n_users, n_items)
        if not config.k_core or len(user_idx) in (before, 0):
            break
    if config.k_core:
        counts["k_core"] = {**_step(user_idx, item_idx, n_users, n_items), "rounds": rounds}
    return user_idx, item_idx


def preprocess(raw: RawInteractions | Iterable[RawInteractions],
               config: FilterConfig) -> Interactions:
    """Positives of ``raw`` after dedup and filtering, sorted by (user_id, item_id).

    Args:
      raw: the raw rows, whole or in blocks (``iter_raw``'s): only each block's positives are
        kept, so memory grows with the positives, not with the raw rows.
    """
    blocks = [raw] if isinstance(raw, RawInteractions) else raw
    users, items, kind, counts, files, seen = _positives(blocks, config)
    user_codes, user_ids = pd.factorize(users, sort=True)
    del users
    item_codes, item_ids = pd.factorize(items, sort=True)
    del items
    where = files_read(files)
    check_ids(user_ids, "user_id", where)  # each distinct id once
    check_ids(item_ids, "item_id", where)
    n_items = len(item_ids)
    counts["raw"] = {"rows": seen[0].rows, "users": seen[0].count(user_ids),
                     "items": seen[1].count(item_ids)}
    counts["implicit"] = {"rows": len(user_codes), "users": len(user_ids), "items": n_items}
    if len(user_codes) == 0:
        raise VaecfError(f"no positives: no {kind} passes the threshold "
                         f"(--min-rating {config.min_rating:g}, --min-plays {config.min_plays})")
    pairs = distinct_pairs(user_codes, item_codes, n_items)
    counts["duplicates"] = int(len(user_codes) - len(pairs))
    del user_codes, item_codes
    # Codes number ids in sorted order (factorize(sort=True)), so the sorted pairs are in
    # (user_id, item_id) order; int32 codes halve what the filters copy.
    user_codes = (pairs // n_items).astype(np.int32)
    item_codes = (pairs % n_items).astype(np.int32)
    del pairs
    n_users = len(user_ids)
    counts["dedup"] = _step(user_codes, item_codes, n_users, n_items)
    user_codes, item_codes = _filter(user_codes, item_codes, n_users, n_items, config, counts)
    if len(user_codes) == 0:
        raise VaecfError(
            f"every user was filtered out: none of {counts['dedup']['users']:,} users keeps "
            f"--min-user-items {config.min_user_items} items after dropping items with fewer "
            f"than --min-item-users {config.min_item_users} users; lower the thresholds")
    counts["output"] = _step(user_codes, item_codes, n_users, n_items)
    return Interactions(user_id=np.asarray(user_ids)[user_codes],
                        item_id=np.asarray(item_ids)[item_codes], counts=counts, files=files)


def files_read(labels: Iterable[str]) -> str:
    """The files read, as a message names them: one, or the count and the first."""
    files = list(labels)
    return files[0] if len(files) == 1 else f"{len(files)} files ({files[0]}, ...)"


def _positives(blocks: Iterable[RawInteractions], config: FilterConfig
               ) -> tuple[Ids, Ids, str, dict[str, Any], tuple[str, ...],
                          tuple[_Others, _Others]]:
    """The (user_id, item_id) of every positive row of ``blocks``; the blocks' ``kind``; the
    reader counts; the files read, in order; the raw rows' count and the distinct user and
    item ids of the other rows."""
    users: list[Ids] = []
    items: list[Ids] = []
    seen = (_Others(), _Others())
    counts: dict[str, Any] = {}
    files: dict[str, None] = {}
    kind = ""
    for block in blocks:
        kind = block.kind
        files.update(dict.fromkeys(block.files))
        for key, value in block.counts.items():
            counts[key] = counts.get(key, 0) + value
        keep = positive_mask(block, config)
        seen[0].add(block.user_id, keep)
        seen[1].add(block.item_id, keep)
        users.append(block.user_id[keep])
        items.append(block.item_id[keep])
    user_ids = concat_ids(users)
    del users
    return user_ids, concat_ids(items), kind, counts, tuple(files), seen


class _Others:
    """The raw rows of blocks, counted, and the distinct ids of the rows that are no
    positives (each block's, merged when they outgrow the ids seen so far): with the
    positives' distinct ids, the raw rows' distinct ids, without keeping the raw rows."""

    def __init__(self) -> None:
        self.rows = 0
        self._parts: list[np.ndarray] = []
        self._held = 0
        self._merged = 0

    def add(self, ids: Ids, positive: np.ndarray) -> None:
        self.rows += len(positive)
        if positive.all():
            return
        distinct = np.asarray(pd.unique(ids[~positive]))
        self._parts.append(distinct)
        self._held += len(distinct)
        if self._held > 2 * self._merged + (1 << 20):
            self._parts = [np.asarray(pd.unique(np.concatenate(self._parts)))]
            self._held = self._merged = len(self._parts[0])

    def count(self, positive_ids: Ids) -> int:
        """Distinct ids of all raw rows, given the positives' distinct ids."""
        return len(pd.unique(np.concatenate([*self._parts, np.asarray(positive_ids)])))


def distinct_pairs(user_codes: np.ndarray, item_codes: np.ndarray, n_items: int) -> np.ndarray:
    """(pairs,) int64 ``user_code * n_items + item_code`` of each distinct pair, sorted
    (``np.unique``'s result, sorting one array in place instead of a copy of it)."""
    pairs = user_codes.astype(np.int64, copy=False) * n_items
    pairs += item_codes
    pairs.sort()
    first = np.empty(len(pairs), dtype=bool)
    first[:1] = True
    np.not_equal(pairs[1:], pairs[:-1], out=first[1:])
    return pairs[first]


def filter_config(protocol: str, min_rating: float | None = None, min_plays: int | None = None,
                  min_user_items: int | None = None, min_item_users: int | None = None,
                  k_core: bool = False) -> FilterConfig:
    """The preset of ``protocol`` with any explicitly given threshold overriding it."""
    if protocol not in PRESETS:
        raise VaecfError(f"--protocol: unknown protocol '{protocol}' "
                         f"(one of: {', '.join(PROTOCOLS)})")
    preset = PRESETS[protocol]
    config = FilterConfig(
        protocol=protocol,
        min_rating=4.0 if min_rating is None else min_rating,
        min_plays=1 if min_plays is None else min_plays,
        min_user_items=preset["min_user_items"] if min_user_items is None else min_user_items,
        min_item_users=preset["min_item_users"] if min_item_users is None else min_item_users,
        k_core=k_core)
    for flag, value in (("--min-plays", config.min_plays),
                        ("--min-user-items", config.min_user_items),
                        ("--min-item-users", config.min_item_users)):
        if value < 0:
            raise VaecfError(f"{flag}: must be >= 0, got {value}")
    return config


def write_interactions(path: Path, result: Interactions) -> None:
    """``interactions.parquet``: columns user_id, item_id (raw ids), one row per positive."""
    save_parquet(path, pa.table({"user_id": result.user_id, "item_id": result.item_id}))


def interactions_files(manifest: dict[str, Any], where: str) -> list[str]:
    """The files that hold ``interactions.parquet``'s rows, in order, as a preprocess
    manifest lists them: the file itself, or the parts the Spark engine's tasks wrote to an
    ``s3://`` output (the manifest's ``parts``, each also listed with its checksum)."""
    parts = manifest.get(PARTS)
    if parts is None:
        return [INTERACTIONS]
    names = field(field(manifest, PARTS, where, "dict"), INTERACTIONS, f"{where}: {PARTS}",
                  "list")
    listed = field(manifest, "files", where, "dict")
    if not names or not all(isinstance(n, str) and n in listed for n in names):
        raise VaecfError(f"{where}: {PARTS}: {INTERACTIONS}: expected the names of files it "
                         "lists")
    return list(names)
