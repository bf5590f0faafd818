"""What each task of ``vaecf preprocess --engine spark`` computes: a range of users, whole.

The positives are moved by range of user ids once (``frames.by_user``) and kept
(``persist``): a task holds every positive of its users, and a partition's users follow
those of the one before it. A task deduplicates its pairs (each user's are all there) and
filters them as the pandas engine does (``vaecf.data.preprocess``), given the one global
fact the driver gathers between passes: which items pass the item filter (each item's
users, summed over the partitions). A round of the filters is a pass (``rounds``); the last
one writes the task's pairs, sorted by (user_id, item_id), as a Parquet part
(``pieces.store_part``).

Why a round needs only the items kept: the users a round keeps are those with at least
``min_user_items`` of its items (a user dropped before has fewer of a smaller set), so every
round is computed again from the deduplicated pairs and that set.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from vaecf.data.preprocess import INTERACTIONS_PARTS, distinct_pairs
from vaecf.data.spark.pieces import (
    OTHER_USER,
    POSITIVE,
    factorized,
    gathered,
    packed,
    partition_id,
    store_part,
    task_batch,
    unpacked,
    with_store,
)
from vaecf.data.splits import STREAM_GROUP_ROWS
from vaecf.io.readers import long_id

# a pass's rows: each item of the task's pairs after the filters, with its users (n); the
# task's counts (JSON in text); the part written (JSON of its entry in text); an id too long
# (the survey, text ids); a packed part of the distinct pairs (the survey, in blob)
ITEM, COUNTS, PART, LONG_ID, PACKED = range(5)


def round_schema(user: pa.DataType, item: pa.DataType) -> pa.Schema:
    return pa.schema([("kind", pa.int8()), ("user_id", user), ("item_id", item),
                      ("n", pa.int64()), ("text", pa.string()), ("blob", pa.binary())])


def _pairs(batches: Iterable[pa.RecordBatch], keys: list[int] | None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int] | None:
    """The task's distinct pairs in (user_id, item_id) order: (n,) user and (n,) item codes
    into the distinct users and items (sorted: numbers, or text by code point); the
    positives before deduplication; the users of every raw row (the survey's; 0 after it).
    From the parse's rows of a range of users (the survey, ``keys`` given: the positives
    deduplicated here, the other rows' users counted), or from what the survey ``packed``.
    None for no rows."""
    survey = keys is not None
    if keys is not None:
        rows = gathered(batches, keys)
        if rows is None:
            return None
        table = rows.filter(pc.equal(rows.column("kind"), POSITIVE))
        others = pc.unique(rows.filter(pc.equal(rows.column("kind"), OTHER_USER))
                           .column("user_id")).to_numpy(zero_copy_only=False)
    else:
        table, others = unpacked(batches), np.zeros(0)
        if table is None:
            return None
    user_codes, users = factorized(table.column("user_id"))
    item_codes, items = factorized(table.column("item_id"))
    if survey and len(items):
        pairs = distinct_pairs(user_codes, item_codes, len(items))
        user_codes, item_codes = pairs // len(items), pairs % len(items)
    raw_users = 0
    if survey:  # the positives' users and the other rows' users that are not among them
        raw_users = len(users) + int(np.count_nonzero(pd.Index(users).get_indexer(others) < 0))
    return (user_codes.astype(np.int32), item_codes.astype(np.int32), users, items,
            table.num_rows, raw_users)


def rounds(batches: Iterable[pa.RecordBatch], keys: list[int] | None, kept: Any,
           min_user_items: int, schema: pa.Schema, uri: str | None, part_schema: pa.Schema,
           environment: dict[str, str]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function: the task's positives deduplicated and surveyed (given
    ``keys``, the partitions' of ``frames.by_user``: no filter; an id too long is told; the
    distinct pairs ``packed``, sorted, for the rounds), or one round of the filters over
    those: ``kept``, a broadcast of the items the item filter keeps, or None for no item
    filter; then the users with ``min_user_items`` of them. Given ``uri``, the pairs kept
    are written there as the part ``interactions/part-<partition>.parquet``
    (``part_schema``).

    Yields ``ITEM`` rows (the items of the pairs kept, with their users), one ``COUNTS``
    row: ``{"rows", "users"}`` of the deduplicated pairs (``dedup``, with ``"positives"``,
    the rows before deduplication), after the item filter (``items``) and after both
    (``users``); and the ``PART`` written."""
    found = _pairs(batches, keys)
    if found is None:
        return
    survey = keys is not None
    user_codes, item_codes, users, items, positives, raw_users = found
    counts: dict[str, Any] = {"dedup": {"rows": len(user_codes), "users": len(users),
                                        "positives": positives}}

    def kept_pairs() -> pa.Table:
        return pa.table([pa.array(ids, field.type).take(pa.array(codes)) for ids, codes, field
                         in ((users, user_codes, part_schema[0]),
                             (items, item_codes, part_schema[1]))], schema=part_schema)

    if survey:
        counts["raw"] = {"users": raw_users}
        for column, ids in (("user_id", users), ("item_id", items)):
            longest = long_id(ids)
            if longest is not None:
                yield task_batch(schema, kind=LONG_ID, **{column: [longest[0]]})
        yield from packed(kept_pairs(), schema, kind=PACKED)
    else:
        if kept is not None:
            keep = pd.Index(kept.value).get_indexer(items)[item_codes] >= 0
            user_codes, item_codes = user_codes[keep], item_codes[keep]
        counts["items"] = {"rows": len(user_codes),
                           "users": int(np.count_nonzero(np.bincount(user_codes)))}
        per_user = np.bincount(user_codes, minlength=len(users))
        keep = per_user[user_codes] >= min_user_items
        user_codes, item_codes = user_codes[keep], item_codes[keep]
        counts["users"] = {"rows": len(user_codes),
                           "users": int(np.count_nonzero(per_user >= min_user_items))}
    per_item = np.bincount(item_codes, minlength=len(items))
    present = np.flatnonzero(per_item)
    yield task_batch(schema, kind=ITEM, item_id=items[present], n=per_item[present])
    yield task_batch(schema, kind=COUNTS, text=[json.dumps(counts)])
    if uri is not None and len(user_codes):
        with_store(environment)
        name = f"{INTERACTIONS_PARTS}/part-{partition_id():05d}.parquet"
        written = store_part(kept_pairs().to_batches(), uri, name, part_schema,
                             STREAM_GROUP_ROWS)
        assert written is not None
        name, digest, size, rows, groups = written
        yield task_batch(schema, kind=PART, text=[json.dumps(
            {"name": name, "sha256": digest, "bytes": size, "rows": rows,
             "row_groups": json.loads(groups)})])
