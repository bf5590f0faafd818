"""Split implicit interactions into train/val/test users and fold_in/holdout items.

A pure function of the data and ``config.seed``: every user and every pair is placed by its
seeded key (``vaecf.data.split_keys``), never by a random stream or by the order of rows, so
the order and chunking of the input do not matter and any engine that computes the same keys
(pandas here, Spark) makes the same split. The manifest names the rule (``split_function``).

Rules (DESIGN.md section 4):
- users ordered by (user key, id text): ``mission`` holds out the first
  ``round(val_fraction * n)`` as val and the next ``round(test_fraction * n)`` as test (7% +
  7%), ``paper`` a fixed number each (``heldout_users``); the rest are train;
- the item universe is the items of training users; val/test pairs outside it are dropped,
  and a held-out user left with no items is dropped (both counted);
- each held-out user's items ordered by (pair key, item id text): the first
  ``floor(holdout_fraction * n)`` form the holdout, the rest the fold_in (Liang et al.'s
  count). A user with fewer than ``1 / holdout_fraction`` items (fewer than 5 at 20%)
  therefore has an empty holdout: the user stays in the fold_in matrix and evaluation counts
  it as skipped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from vaecf.data.split_keys import SPLIT_FUNCTION, id_text, pair_keys, text_keys
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
from vaecf.io.readers import IDS, read_parquet


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
    """(val users, test users) to hold out of ``n_users``: every engine's counts (Python's
    ``round``, halves to even, on the driver)."""
    if config.heldout_users is not None:
        n_val = n_test = config.heldout_users
    else:
        n_val = round(config.val_fraction * n_users)
        n_test = round(config.test_fraction * n_users)
    if n_val + n_test >= n_users or min(n_val, n_test) < 1:
        raise VaecfError(f"cannot hold out {n_val} val + {n_test} test users of {n_users}: "
                         "too few users for this split")
    return n_val, n_test


def _assign_users(user_ids: np.ndarray, user_keys: np.ndarray,
                  config: SplitConfig) -> np.ndarray:
    """(n_users,) int8 split code per user (index into ``SPLITS``).

    Args:
      user_ids: (n_users,) distinct raw ids, in sorted order.
      user_keys: (n_users,) int64 their keys: users ordered by (key, id text), the first
        ``n_val`` are val, the next ``n_test`` test, the rest train.
    """
    n_users = len(user_ids)
    n_val, n_test = heldout_counts(n_users, config)
    order = np.lexsort((_text_ranks(user_ids), user_keys))
    codes = np.zeros(n_users, dtype=np.int8)  # train
    codes[order[:n_val]] = SPLITS.index("val")
    codes[order[n_val:n_val + n_test]] = SPLITS.index("test")
    return codes


def _text_ranks(ids: np.ndarray) -> np.ndarray:
    """(n,) int64 rank of each of ``ids`` (distinct) by its text, the keys' tie-break.

    Python's ``str`` order is code point order, which is UTF-8 byte order (Spark's).
    """
    if ids.dtype.kind in "iu":  # decimal digits, as id_text writes them, without a Python loop
        texts = ids.astype(str)
    else:
        texts = np.array([id_text(v) for v in ids.tolist()], dtype=object)
    ranks = np.empty(len(texts), dtype=np.int64)
    ranks[np.argsort(texts, kind="stable")] = np.arange(len(texts))
    return ranks


def split_interactions(interactions: pd.DataFrame, config: SplitConfig) -> SplitResult:
    """Split positive (user_id, item_id) pairs; duplicates must already be removed.

    Args:
      interactions: columns ``user_id`` and ``item_id`` (raw ids), one row per positive pair.
      config: fractions and seed.
    """
    user_pos, user_ids = _sorted_codes(interactions["user_id"].to_numpy())
    item_pos, item_ids = _sorted_codes(interactions["item_id"].to_numpy())
    return split_codes(user_pos, user_ids, item_pos, item_ids, config)


def split_parquet(path: Path | list[Path], config: SplitConfig) -> SplitResult:
    """``split_interactions`` of an ``interactions.parquet`` (or its parts, read one after
    the other), reading one column at a time and keeping only its int32 codes: 8 bytes per
    pair, never the ids of every row (16 bytes, or a Python string per row of text ids)."""
    codes = [_column_codes(path, name) for name in ("user_id", "item_id")]
    (user_pos, user_ids), (item_pos, item_ids) = codes
    del codes
    return split_codes(user_pos, user_ids, item_pos, item_ids, config)


def _sorted_codes(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n,) int32 position of each of ``ids`` among its distinct values, and those values
    (sorted): ``np.unique(ids, return_inverse=True)`` swapped, by hashing instead of sorting
    every row."""
    codes, distinct = pd.factorize(ids, sort=True)
    return codes.astype(np.int32), np.asarray(distinct)


def _column_codes(path: Path | list[Path], name: str) -> tuple[np.ndarray, np.ndarray]:
    """``_sorted_codes`` of the column ``name`` of a Parquet file (or of parts, in order),
    dictionary-encoded by pyarrow: one value per distinct id, an int32 index per row. Text
    sorts by its UTF-8 bytes, which is code point order (Python's, and ``np.unique``'s)."""
    paths = path if isinstance(path, list) else [path]
    columns = [read_parquet(p, {name: IDS}).column(name) for p in paths]
    ids = pa.chunked_array([c for column in columns for c in column.chunks], columns[0].type)
    del columns
    if ids.null_count:
        raise VaecfError(f"{path if len(paths) == 1 else paths[0].parent}: column {name}: "
                         f"{ids.null_count:,} empty ids")
    encoded = pa.table({name: pc.dictionary_encode(ids)}).unify_dictionaries().column(name)
    del ids
    chunks = encoded.chunks
    if not chunks:
        return np.zeros(0, np.int32), np.zeros(0, encoded.type.value_type.to_pandas_dtype())
    order = pc.sort_indices(chunks[0].dictionary).to_numpy()
    rank = np.empty(len(order), dtype=np.int32)
    rank[order] = np.arange(len(order), dtype=np.int32)
    codes = np.concatenate([rank[chunk.indices.to_numpy()] for chunk in chunks])
    return codes, chunks[0].dictionary.take(pa.array(order)).to_numpy(zero_copy_only=False)


def split_codes(user_pos: np.ndarray, user_ids: np.ndarray, item_pos: np.ndarray,
                all_items: np.ndarray, config: SplitConfig) -> SplitResult:
    """Split positive pairs given as codes.

    Args:
      user_pos, item_pos: (n,) int32 each pair's user in ``user_ids`` and item in
        ``all_items``, the distinct raw ids, sorted.
      config: fractions and seed.
    """
    user_keys = text_keys(config.seed, user_ids)
    split_of_user = _assign_users(user_ids, user_keys, config)
    # The item universe: the items of training users, numbered in sorted order.
    in_universe_item = np.zeros(len(all_items), dtype=bool)
    in_universe_item[item_pos[split_of_user[user_pos] == 0]] = True
    item_ids = all_items[in_universe_item]
    in_universe = in_universe_item[item_pos]
    counts: dict[str, Any] = {"pairs_outside_item_universe": int((~in_universe).sum())}
    item_idx = (np.cumsum(in_universe_item, dtype=np.int32) - 1)[item_pos[in_universe]]
    user_pos = user_pos[in_universe]
    del in_universe

    kept = np.zeros(len(user_ids), dtype=bool)
    kept[user_pos] = True
    counts["heldout_users_without_items"] = int((~kept).sum())
    # user_idx: train users, then val, then test; sorted by user_id within each split.
    order = np.lexsort((np.arange(len(user_ids)), split_of_user))
    order = order[kept[order]]
    idx_of_pos = np.full(len(user_ids), -1, dtype=np.int32)
    idx_of_pos[order] = np.arange(len(order), dtype=np.int32)
    users = pd.DataFrame({"user_idx": np.arange(len(order), dtype=np.int32),
                          "user_id": user_ids[order],
                          "split": np.asarray(SPLITS)[split_of_user[order]]})

    # The canonical (user_idx, item_idx) order: one int64 key per pair sorted in place
    # (lexsort's permutation and the gathers through it cost three times the memory).
    n_items = len(item_ids)
    pairs = idx_of_pos[user_pos].astype(np.int64) * n_items
    del user_pos
    pairs += item_idx
    del item_idx
    pairs.sort()
    user_idx = (pairs // n_items).astype(np.int32)
    item_idx = (pairs % n_items).astype(np.int32)
    del pairs
    split_of_idx = split_of_user[order]
    part = place_pairs(user_idx, item_idx, split_of_idx, user_keys[order],
                       *item_order(config.seed, item_ids), config.holdout_fraction)
    for split, count in zip(SPLITS[1:], without_holdout(user_idx, part, split_of_idx),
                            strict=True):
        counts[f"{split}_users_without_holdout"] = count
    pairs = pd.DataFrame({
        "user_idx": user_idx, "item_idx": item_idx,
        "part": pd.Categorical.from_codes(part, categories=matrix_names())}, copy=False)
    return SplitResult(users=users, item_ids=item_ids, pairs=pairs, counts=counts)


def item_order(seed: int, item_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n_items,) int64 key and (n_items,) int64 text rank of each item of the universe
    (``item_ids``, distinct): the held-out items' order, (pair key, item id text)."""
    return text_keys(seed, item_ids), _text_ranks(item_ids)


def place_pairs(user_idx: np.ndarray, item_idx: np.ndarray, split: np.ndarray,
                user_keys: np.ndarray, item_keys: np.ndarray, item_ranks: np.ndarray,
                holdout_fraction: float) -> np.ndarray:
    """Part code per pair (index into ``matrix_names()``: train, val_fold_in, val_holdout,
    test_fold_in, test_holdout): each held-out user's items ordered by (pair key, item id
    text), the first ``floor(holdout_fraction * n)`` the holdout. Every engine's rule: the
    pandas engine calls it on every user, the Spark engine's tasks on their users.

    Args:
      user_idx: (n,) sorted; pairs in (user_idx, item_idx) order; users numbered from 0.
      item_idx: (n,) index into the universe.
      split: (n_users,) split code per user_idx.
      user_keys: (n_users,) int64 key per user_idx.
      item_keys, item_ranks: (n_items,) the universe's ``item_order``.
    """
    part = np.zeros(len(user_idx), dtype=np.int8)  # train
    heldout = np.flatnonzero(split[user_idx] != 0)
    users, items = user_idx[heldout], item_idx[heldout]
    keys = pair_keys(user_keys[users], item_keys[items])
    order = np.lexsort((item_ranks[items], keys, users))
    sizes = np.bincount(users, minlength=len(split))
    starts = np.cumsum(sizes) - sizes
    in_order = users[order]
    holdout = np.empty(len(order), dtype=bool)
    holdout[order] = (np.arange(len(order)) - starts[in_order]) < np.floor(
        holdout_fraction * sizes[in_order])
    part[heldout] = 2 * split[users] - 1 + holdout
    return part


def without_holdout(user_idx: np.ndarray, part: np.ndarray, split: np.ndarray) -> list[int]:
    """The val and the test users (``split``: code per user_idx) of whom no pair of
    ``user_idx`` is in the holdout (``part``: ``place_pairs``')."""
    return [int((split == code).sum() - len(np.unique(user_idx[part == 2 * code])))
            for code in range(1, len(SPLITS))]


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
    parts = result.pairs["part"].cat.codes.to_numpy()
    for code, part in enumerate(matrix_names()):
        split = part.split("_")[0]
        pairs = pa.record_batch([_part_column(result.pairs["user_idx"], parts, code),
                                 _part_column(result.pairs["item_idx"], parts, code)],
                                schema=PAIRS_SCHEMA)
        shape, offset = (n_users[split], n_items), user_offset[split]
        if part == "train":  # in row groups a rank can read alone: its share
            pair_counts[part], row_groups = write_part(directory, part, [pairs], shape, offset,
                                                       row_group_rows(pairs.num_rows))
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


def _part_column(column: pd.Series, parts: np.ndarray, code: int) -> np.ndarray:
    """(rows of the part,) int32 ``column`` where ``parts == code``; a view when those rows
    are the first ones (training's: train users come first), else a copy."""
    values = column.to_numpy(np.int32)
    rows = parts == code
    count = int(np.count_nonzero(rows))
    return values[:count] if rows[:count].all() else values[rows]


def user_offsets(n_users: dict[str, int]) -> dict[str, int]:
    """Each split's first ``user_idx``: train users first, then val, then test."""
    return {"train": 0, "val": n_users["train"], "test": n_users["train"] + n_users["val"]}


def write_split_manifest(directory: Path, *, counts: dict[str, Any], pairs: dict[str, int],
                         n_users: dict[str, int], n_items: int, inputs: dict[str, Any],
                         parameters: dict[str, Any], started: float,
                         extra: dict[str, Any],
                         written: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """``dataset_manifest.json`` of the split files in ``directory`` (every engine's) and of
    those ``written`` elsewhere (``write_manifest``: a cluster's parts)."""
    return write_manifest(
        directory, MANIFEST_STAGE, inputs=inputs, parameters=parameters,
        counts={**counts, "pairs": pairs, "users": n_users, "items": n_items},
        started=started,
        extra={**extra, "split_function": SPLIT_FUNCTION, "n_items": n_items,
               "n_users": n_users, "user_offset": user_offsets(n_users)}, written=written)


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
