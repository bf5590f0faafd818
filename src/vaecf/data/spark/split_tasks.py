"""What each task of ``vaecf split --engine spark`` computes: a range of users, whole.

The pairs are moved by range of user ids once (``frames.by_user``), so a task holds every
pair of its users and the users of a partition follow those of the one before it. A task
then places its users as the pandas engine places all of them (``vaecf.data.split``: the
same keys, the same ``place_pairs``), given the few global facts the driver gathered: the
two users that start the test and the train users in key order (``Bounds``), the item
universe, and where each split's users of this partition start in ``user_idx``. ``pack``
keeps each partition's pairs as Arrow IPC values in the persisted frame, with one row per
user and its key (the driver finds the bounds among those); then two passes over the packed
partitions:

- ``survey``: the training users' items (the universe's candidates), the users of each split
  sure to be kept (a held-out user with an item that a training user of the same partition
  has), the held-out pairs of the other held-out users (rarely any: the driver checks them
  against the universe), and the training pairs;
- ``place``: every pair's part and user_idx, written as sorted Parquet parts of each table
  (``pieces.store_part``), with the partition's counts.

The keys are ``split_keys``' (a user's hashed once per pass, each pair's key vectorised
over the partition), never a Python function per row.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from vaecf.data.spark.pieces import (
    PARTS,
    factorized,
    gathered,
    packed,
    partition_id,
    store_part,
    task_batch,
    unpacked,
    with_store,
)
from vaecf.data.split import place_pairs, without_holdout
from vaecf.data.split_keys import id_text, text_keys
from vaecf.data.splits import PAIRS_SCHEMA, SPLITS, STREAM_GROUP_ROWS, matrix_names

_TRAIN, _VAL, _TEST = range(len(SPLITS))
# survey's rows: an item of a training user; the users of a split sure to be kept (n); a
# pair of a held-out user not yet sure to be kept; the training pairs (n)
ITEM, KEPT, UNSURE, TRAIN_PAIRS = range(4)
# pack's rows: a user and its key; a packed part of the task's pairs
USER, PACKED = range(2)
COUNTS = "counts"  # place's row of the partition's counts (JSON): no part


@dataclass(frozen=True)
class Bounds:
    """The first test user and the first training user in (key, id text) order (users
    before the first are val, then test, then train), as (key, id text)."""

    test: tuple[int, str]
    train: tuple[int, str]


def survey_schema(user: pa.DataType, item: pa.DataType) -> pa.Schema:
    return pa.schema([("kind", pa.int8()), ("partition", pa.int32()), ("split", pa.int8()),
                      ("user_id", user), ("item_id", item), ("n", pa.int64())])


def user_splits(seed: int, ids: np.ndarray, bounds: Bounds) -> tuple[np.ndarray, np.ndarray]:
    """(n,) int8 split code and (n,) int64 key of each of the distinct user ``ids``."""
    keys = text_keys(seed, ids)
    codes = np.full(len(ids), _TRAIN, np.int8)
    codes[_before(keys, ids, bounds.train)] = _TEST
    codes[_before(keys, ids, bounds.test)] = _VAL
    return codes, keys


def _before(keys: np.ndarray, ids: np.ndarray, bound: tuple[int, str]) -> np.ndarray:
    """Which users come before ``bound`` in (key, id text) order."""
    key, text = bound
    before = keys < key
    for tie in np.flatnonzero(keys == key):
        before[tie] = id_text(ids[tie]) < text
    return before


def pack_schema(user: pa.DataType) -> pa.Schema:
    return pa.schema([("kind", pa.int8()), ("user_id", user), ("key", pa.int64()),
                      ("blob", pa.binary())])


def pack(batches: Iterable[pa.RecordBatch], seed: int, keys: list[int], schema: pa.Schema
         ) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function over the pairs moved by user range (``frames.by_user``,
    whose partitions' ``keys``): each distinct user with its key (``USER`` rows: the driver
    finds the bounds among them), and the task's pairs ``packed`` (``PACKED`` rows), which
    the frame keeps for the two passes."""
    table = gathered(batches, keys)
    if table is None:
        return
    users = pc.unique(table.column("user_id")).to_numpy(zero_copy_only=False)
    yield task_batch(schema, kind=USER, user_id=users, key=text_keys(seed, users))
    yield from packed(table, schema, kind=PACKED)


def _load(batches: Iterable[pa.RecordBatch]
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The task's pairs, ``pack``ed: (n,) each pair's user in the distinct users (sorted:
    numbers, or text by code point), those users, (n,) each pair's item in the distinct
    items, those items (``pieces.factorized``); None for no pairs."""
    table = unpacked(batches)
    if table is None:
        return None
    return (*factorized(table.column("user_id")), *factorized(table.column("item_id")))


def survey(batches: Iterable[pa.RecordBatch], seed: int, bounds: Bounds,
           schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function, first pass (``schema``: ``survey_schema``)."""
    loaded = _load(batches)
    if loaded is None:
        return
    codes, users, item_codes, items = loaded
    partition = partition_id()
    split, _ = user_splits(seed, users, bounds)
    train = split[codes] == _TRAIN
    in_train = np.bincount(item_codes[train], minlength=len(items)) > 0
    train_items = items[in_train]
    heldout = np.flatnonzero(~train)
    shared = in_train[item_codes[heldout]]
    sure = split == _TRAIN
    sure[codes[heldout[shared]]] = True
    unsure = heldout[~sure[codes[heldout]]]
    kept = np.bincount(split[sure], minlength=len(SPLITS))

    yield task_batch(schema, kind=ITEM, partition=partition, item_id=train_items)
    yield task_batch(schema, kind=KEPT, partition=partition,
                     split=np.arange(len(SPLITS), dtype=np.int8), n=kept)
    yield task_batch(schema, kind=TRAIN_PAIRS, partition=partition, n=[int(train.sum())])
    if len(unsure):
        yield task_batch(schema, kind=UNSURE, partition=partition, split=split[codes[unsure]],
                         user_id=users[codes[unsure]], item_id=items[item_codes[unsure]])


@dataclass(frozen=True)
class Universe:
    """The item universe, sorted (``item_idx`` order), and its ``item_order``."""

    ids: np.ndarray
    keys: np.ndarray
    ranks: np.ndarray


def place(batches: Iterable[pa.RecordBatch], seed: int, bounds: Bounds, universe: Any,
          firsts: dict[int, list[int]], holdout_fraction: float, uri: str,
          group_rows: dict[str, int], index_schema: pa.Schema,
          environment: dict[str, str]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function, second pass: the task's pairs placed and written as parts
    ``<uri>/<matrix>/part-<partition>.parquet`` (sorted by user_idx, item_idx; row groups
    of ``group_rows[table]``) and its users as ``user_index/part-<partition>-<split>.parquet``
    (``index_schema``); yields ``PARTS`` rows, and one row named ``COUNTS`` whose
    ``row_groups`` holds the partition's counts. ``universe``: a broadcast ``Universe``;
    ``firsts[partition]``: the first user_idx of each split's kept users here."""
    loaded = _load(batches)
    if loaded is None:
        return
    with_store(environment)
    codes, users, item_codes, items = loaded
    partition = partition_id()
    known: Universe = universe.value
    split, user_keys = user_splits(seed, users, bounds)
    item_idx = pd.Index(known.ids).get_indexer(items)[item_codes]
    inside = item_idx >= 0
    outside = int(len(inside) - inside.sum())
    codes, item_idx = codes[inside], item_idx[inside]
    has = np.zeros(len(users), bool)
    has[codes] = True
    order = np.flatnonzero(has)
    order = order[np.argsort(split[order], kind="stable")]  # by (split, user id)
    local = np.full(len(users), -1, np.int64)
    local[order] = np.arange(len(order))
    n_items = len(known.ids)
    key = local[codes] * n_items + item_idx
    key.sort()
    user_local, item_sorted = key // n_items, (key % n_items).astype(np.int32)
    del key, codes, item_idx
    split_local = split[order]
    part = place_pairs(user_local, item_sorted, split_local, user_keys[order], known.keys,
                       known.ranks, holdout_fraction)
    counts = {"outside": outside, "without_holdout": without_holdout(user_local, part,
                                                                      split_local)}
    starts = np.searchsorted(split_local, np.arange(len(SPLITS) + 1))
    first = np.asarray(firsts[partition], np.int64)
    user_idx = (first[split_local] + np.arange(len(order)) - starts[split_local]).astype(np.int32)
    by_part = np.argsort(part, kind="stable")
    ends = np.searchsorted(part[by_part], np.arange(len(matrix_names()) + 1))
    for code, name in enumerate(matrix_names()):
        rows = by_part[ends[code]:ends[code + 1]]
        batch = task_batch(PAIRS_SCHEMA, user_idx=user_idx[user_local[rows]],
                           item_idx=item_sorted[rows])
        yield from _written(store_part([batch], uri, f"{name}/part-{partition:05d}.parquet",
                                       PAIRS_SCHEMA, group_rows[name]), partition)
    for code, name in enumerate(SPLITS):
        own = slice(starts[code], starts[code + 1])
        batch = task_batch(index_schema, user_idx=user_idx[own], user_id=users[order[own]],
                           split=np.full(own.stop - own.start, name, object))
        yield from _written(store_part([batch], uri, f"user_index/part-{partition:05d}-"
                                       f"{code}.parquet", index_schema, group_rows["user_index"]),
                            partition)
    yield task_batch(PARTS, partition=partition, name=[COUNTS], row_groups=[json.dumps(counts)])


def _written(found: tuple[str, str, int, int, str] | None,
             partition: int) -> Iterator[pa.RecordBatch]:
    if found is not None:
        yield task_batch(PARTS, partition=partition,
                         **{f.name: [v] for f, v in zip(list(PARTS)[1:], found, strict=True)})


def item_table(ids: np.ndarray, schema: pa.Schema) -> pa.Table:
    """``item_index``: (item_idx, item_id) of the universe ``ids``, sorted."""
    return pa.table([pa.array(np.arange(len(ids), dtype=np.int32)), pa.array(ids,
                                                                              schema[1].type)],
                    schema=schema)


def write_items(batches: Iterable[pa.RecordBatch], universe: Any, uri: str, schema: pa.Schema,
                environment: dict[str, str]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function of a one-row frame: ``item_index`` written as the part
    ``<uri>/item_index/part-00000.parquet`` from the broadcast ``Universe``."""
    for _ in batches:
        pass
    with_store(environment)
    table = item_table(universe.value.ids, schema)
    yield from _written(store_part(table.to_batches(), uri, "item_index/part-00000.parquet",
                                   schema, STREAM_GROUP_ROWS), 0)
