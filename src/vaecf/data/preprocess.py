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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from vaecf.data.readers import RawInteractions
from vaecf.data.splits import save_parquet
from vaecf.errors import VaecfError

PROTOCOLS = ("mission", "paper")
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
    """Positive pairs sorted by (user_id, item_id), and the counts of every step."""

    user_id: np.ndarray
    item_id: np.ndarray
    counts: dict[str, Any]


def positive_mask(raw: RawInteractions, config: FilterConfig) -> np.ndarray:
    """(n,) bool: which raw rows are positives under the dataset's rule."""
    if raw.kind == "rating":
        return np.asarray(raw.value >= config.min_rating)
    if raw.kind == "plays":
        return np.asarray(raw.value >= config.min_plays)
    return np.ones(len(raw.value), dtype=bool)


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


def preprocess(raw: RawInteractions, config: FilterConfig) -> Interactions:
    """Positives of ``raw`` after dedup and filtering, sorted by (user_id, item_id)."""
    user_codes, user_ids = pd.factorize(raw.user_id, sort=True)
    item_codes, item_ids = pd.factorize(raw.item_id, sort=True)
    n_users, n_items = len(user_ids), len(item_ids)
    counts: dict[str, Any] = {**raw.counts,
                              "raw": _step(user_codes, item_codes, n_users, n_items)}
    keep = positive_mask(raw, config)
    user_codes, item_codes = user_codes[keep], item_codes[keep]
    counts["implicit"] = _step(user_codes, item_codes, n_users, n_items)
    if len(user_codes) == 0:
        raise VaecfError(f"no positives: no {raw.kind} passes the threshold "
                         f"(--min-rating {config.min_rating:g}, --min-plays {config.min_plays})")
    # One sort gives both the deduplication and the deterministic (user_id, item_id) order,
    # because factorize(sort=True) numbers ids in sorted order.
    pairs = np.unique(user_codes.astype(np.int64) * n_items + item_codes)
    counts["duplicates"] = int(len(user_codes) - len(pairs))
    user_codes, item_codes = pairs // n_items, pairs % n_items
    counts["dedup"] = _step(user_codes, item_codes, n_users, n_items)
    user_codes, item_codes = _filter(user_codes, item_codes, n_users, n_items, config, counts)
    if len(user_codes) == 0:
        raise VaecfError(
            f"every user was filtered out: none of {counts['dedup']['users']:,} users keeps "
            f"--min-user-items {config.min_user_items} items after dropping items with fewer "
            f"than --min-item-users {config.min_item_users} users; lower the thresholds")
    counts["output"] = _step(user_codes, item_codes, n_users, n_items)
    return Interactions(user_id=np.asarray(user_ids)[user_codes],
                        item_id=np.asarray(item_ids)[item_codes], counts=counts)


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
