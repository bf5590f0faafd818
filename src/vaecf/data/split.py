"""Split implicit interactions into train/val/test users and fold_in/holdout items.

A pure function of (interactions, config): pairs are put in a canonical order first, so the
order of input rows does not matter, and all randomness comes from ``config.seed``.

Rules (DESIGN.md section 4):
- users are permuted with the seed; ``mission`` holds out ``val_fraction`` and
  ``test_fraction`` of them (7% + 7%), ``paper`` a fixed number each (``heldout_users``);
- the item universe is the items of training users; val/test pairs outside it are dropped,
  and a held-out user left with no items is dropped (both counted);
- each held-out user's items are shuffled and ``floor(holdout_fraction * n)`` of them form
  the holdout, the rest the fold_in (as Liang et al.'s code). A user with fewer than
  ``1 / holdout_fraction`` items (fewer than 5 at 20%) therefore has an empty holdout: the
  user stays in the fold_in matrix and evaluation counts it as skipped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from vaecf.data.splits import (
    MANIFEST_STAGE,
    PAIRS_SCHEMA,
    ROW_GROUPS,
    SPLITS,
    matrix_names,
    row_group_rows,
    save_parquet,
    write_part,
)
from vaecf.errors import VaecfError
from vaecf.io.manifest import write_manifest


@dataclass(frozen=True)
class SplitConfig:
    """How to split. ``heldout_users`` (users in val and in test) overrides the fractions."""

    seed: int = 98765
    val_fraction: float = 0.07
    test_fraction: float = 0.07
    heldout_users: int | None = None
    holdout_fraction: float = 0.2


@dataclass(frozen=True)
class SplitResult:
    """The split in memory. ``users`` has user_id, user_idx, split; ``pairs`` one row per pair
    with user_idx, item_idx and part (``train``, ``val_fold_in``, ``val_holdout``, ...)."""

    users: pd.DataFrame
    item_ids: np.ndarray
    pairs: pd.DataFrame
    counts: dict[str, Any]


def heldout_counts(n_users: int, config: SplitConfig) -> tuple[int, int]:
    """(val users, test users) to hold out of ``n_users``: every engine's counts."""
    if config.heldout_users is not None:
        n_val = n_test = config.heldout_users
    else:
        n_val = round(config.val_fraction * n_users)
        n_test = round(config.test_fraction * n_users)
    if n_val + n_test >= n_users or min(n_val, n_test) < 1:
        raise VaecfError(f"cannot hold out {n_val} val + {n_test} test users of {n_users}: "
                         "too few users for this split")
    return n_val, n_test


def _assign_users(n_users: int, config: SplitConfig) -> np.ndarray:
    """(n_users,) int8 split code per user (index into ``SPLITS``), users in sorted-id order."""
    n_val, n_test = heldout_counts(n_users, config)
    order = np.random.default_rng(config.seed).permutation(n_users)
    codes = np.zeros(n_users, dtype=np.int8)  # train
    codes[order[:n_val]] = SPLITS.index("val")
    codes[order[n_val:n_val + n_test]] = SPLITS.index("test")
    return codes


def split_interactions(interactions: pd.DataFrame, config: SplitConfig) -> SplitResult:
    """Split positive (user_id, item_id) pairs; duplicates must already be removed.

    Args:
      interactions: columns ``user_id`` and ``item_id`` (raw ids), one row per positive pair.
      config: fractions and seed.
    """
    user_ids, user_pos = np.unique(interactions["user_id"].to_numpy(), return_inverse=True)
    raw_items = interactions["item_id"].to_numpy()
    split_of_user = _assign_users(len(user_ids), config)
    item_ids = np.unique(raw_items[split_of_user[user_pos] == 0])
    item_idx = np.minimum(np.searchsorted(item_ids, raw_items), len(item_ids) - 1)
    in_universe = item_ids[item_idx] == raw_items
    counts: dict[str, Any] = {"pairs_outside_item_universe": int((~in_universe).sum())}
    user_pos, item_idx = user_pos[in_universe], item_idx[in_universe]

    kept = np.zeros(len(user_ids), dtype=bool)
    kept[user_pos] = True
    counts["heldout_users_without_items"] = int((~kept).sum())
    # user_idx: train users, then val, then test; sorted by user_id within each split.
    order = np.lexsort((np.arange(len(user_ids)), split_of_user))
    order = order[kept[order]]
    idx_of_pos = np.full(len(user_ids), -1, dtype=np.int64)
    idx_of_pos[order] = np.arange(len(order))
    users = pd.DataFrame({"user_idx": np.arange(len(order), dtype=np.int32),
                          "user_id": user_ids[order],
                          "split": np.asarray(SPLITS)[split_of_user[order]]})

    user_idx = idx_of_pos[user_pos]
    canonical = np.lexsort((item_idx, user_idx))
    user_idx, item_idx = user_idx[canonical], item_idx[canonical]
    part = _parts(user_idx, split_of_user[order][user_idx], config)
    for code, split in enumerate(SPLITS[1:], start=1):
        with_holdout = len(np.unique(user_idx[part == 2 * code]))
        counts[f"{split}_users_without_holdout"] = int(
            (split_of_user[order] == code).sum() - with_holdout)
    pairs = pd.DataFrame({
        "user_idx": user_idx.astype(np.int32), "item_idx": item_idx.astype(np.int32),
        "part": pd.Categorical.from_codes(part, categories=matrix_names())})
    return SplitResult(users=users, item_ids=item_ids, pairs=pairs, counts=counts)


def _parts(user_idx: np.ndarray, split: np.ndarray, config: SplitConfig) -> np.ndarray:
    """Part code per pair (index into ``matrix_names()``: train, val_fold_in, val_holdout,
    test_fold_in, test_holdout), by a seeded shuffle of each held-out user's items.

    Args:
      user_idx: (n,) sorted; pairs in canonical (user_idx, item_idx) order.
      split: (n,) split code of each pair's user.
    """
    keys = np.random.default_rng([config.seed, 1]).random(len(user_idx))
    order = np.lexsort((keys, user_idx))
    starts = np.searchsorted(user_idx, user_idx, side="left")
    sizes = np.searchsorted(user_idx, user_idx, side="right") - starts
    holdout = np.empty(len(order), dtype=bool)
    holdout[order] = (np.arange(len(order)) - starts) < np.floor(
        config.holdout_fraction * sizes)
    part = np.where(split == 0, 0, 2 * split - 1 + holdout)
    return part.astype(np.int8)


def write_split(result: SplitResult, directory: Path, *, inputs: dict[str, Any],
                parameters: dict[str, Any], started: float,
                dataset: str | None = None) -> dict[str, Any]:
    """Write the split files and ``dataset_manifest.json`` into ``directory``.

    Returns:
      The manifest (also written), with ``n_items``, ``n_users`` and ``user_offset``.
    """
    n_items = len(result.item_ids)
    n_users = {s: int((result.users["split"] == s).sum()) for s in SPLITS}
    user_offset = user_offsets(n_users)
    pair_counts: dict[str, int] = {}
    for part in matrix_names():
        split = part.split("_")[0]
        rows = result.pairs[result.pairs["part"] == part]
        pairs = pa.record_batch([rows["user_idx"].to_numpy(np.int32),
                                 rows["item_idx"].to_numpy(np.int32)], schema=PAIRS_SCHEMA)
        shape, offset = (n_users[split], n_items), user_offset[split]
        if part == "train":  # in row groups a rank can read alone: its share
            pair_counts[part], row_groups = write_part(directory, part, [pairs], shape, offset,
                                                       row_group_rows(len(rows)))
        else:
            pair_counts[part], _ = write_part(directory, part, [pairs], shape, offset)
    save_parquet(directory / "user_index.parquet", pa.Table.from_pandas(
        result.users, preserve_index=False))
    save_parquet(directory / "item_index.parquet", pa.table({
        "item_idx": np.arange(n_items, dtype=np.int32), "item_id": result.item_ids}))
    return write_split_manifest(directory, counts=result.counts, pairs=pair_counts,
                                n_users=n_users, n_items=n_items, inputs=inputs,
                                parameters=parameters, started=started,
                                extra={"dataset": dataset, "engine": "pandas",
                                       ROW_GROUPS: row_groups})


def user_offsets(n_users: dict[str, int]) -> dict[str, int]:
    """Each split's first ``user_idx``: train users first, then val, then test."""
    return {"train": 0, "val": n_users["train"], "test": n_users["train"] + n_users["val"]}


def write_split_manifest(directory: Path, *, counts: dict[str, Any], pairs: dict[str, int],
                         n_users: dict[str, int], n_items: int, inputs: dict[str, Any],
                         parameters: dict[str, Any], started: float,
                         extra: dict[str, Any]) -> dict[str, Any]:
    """``dataset_manifest.json`` of the split files in ``directory`` (every engine's)."""
    return write_manifest(
        directory, MANIFEST_STAGE, inputs=inputs, parameters=parameters,
        counts={**counts, "pairs": pairs, "users": n_users, "items": n_items},
        started=started,
        extra={**extra, "n_items": n_items, "n_users": n_users,
               "user_offset": user_offsets(n_users)})


def write_synthetic_split(directory: Path, n_users: int, n_items: int, seed: int,
                          mean_items: float = 146.0) -> dict[str, Any]:
    """Generate planted ratings and write their split, as download -> preprocess -> split would.

    For benchmarks and tests that need a split without running the three stages; the
    positives go through the same implicit rule and filters as ``vaecf preprocess``.
    """
    from vaecf.data.preprocess import filter_config, preprocess
    from vaecf.data.readers import RawInteractions
    from vaecf.data.synthetic import generate_ratings

    ratings = generate_ratings(n_users, n_items, seed=seed, mean_items=mean_items)
    raw = RawInteractions(user_id=ratings["userId"].to_numpy(),
                          item_id=ratings["movieId"].to_numpy(),
                          value=ratings["rating"].to_numpy(), kind="rating",
                          files=("synthetic",))
    positives = preprocess(raw, filter_config("mission"))
    config = SplitConfig(seed=seed)
    pairs = pd.DataFrame({"user_id": positives.user_id, "item_id": positives.item_id})
    return write_split(split_interactions(pairs, config), directory,
                       inputs={"synthetic": {"n_users": n_users, "n_items": n_items,
                                             "seed": seed, "mean_items": mean_items}},
                       parameters=asdict(config), started=0.0, dataset="synthetic")
