"""The split's keys: seeded 64-bit hashes that every engine computes identically.

The split is a function of the data and the seed alone, never of row order, partitioning or
a random stream, so that the pandas and Spark engines (and any run on any number of
partitions) assign every user and every pair the same way:

- a user's key is the first 8 bytes (big-endian) of SHA-256 over ``"<seed>\\x1f<user id>"``,
  the id as text (an integer id as its decimal digits); an item's key likewise;
- a pair's key mixes its user's and its item's keys with SplitMix64's finaliser (wrapping
  unsigned 64-bit arithmetic), so that it is computed vectorised, per pair, without hashing
  text a second time;
- keys compare as signed 64-bit integers (``int64``, as Spark's ``LongType`` does), ties
  broken by the id's text.

``SPLIT_FUNCTION`` names this definition; the split's manifest records it. The Spark
engine's tasks call these functions on their users (``vaecf.data.spark.split_tasks``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

SPLIT_FUNCTION = "sha256-splitmix64-v1"
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)


def id_text(value: object) -> str:
    """An id as the keys see it: text as it is, an integer as its decimal digits."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"an id cannot be a boolean: {value!r}")
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, str):
        return value
    raise TypeError(f"an id must be text or an integer, not {type(value).__name__}")


def text_keys(seed: int, ids: Iterable[object]) -> np.ndarray:
    """(n,) int64 keys of ``ids`` (text or integers) under ``seed``."""
    prefix = f"{int(seed)}\x1f".encode()
    keys = [int.from_bytes(hashlib.sha256(prefix + id_text(v).encode()).digest()[:8], "big")
            for v in ids]
    return np.array(keys, dtype=np.uint64).view(np.int64)


def pair_keys(user_keys: np.ndarray, item_keys: np.ndarray) -> np.ndarray:
    """(n,) int64 keys of pairs, from their users' and items' keys (each (n,) int64)."""
    with np.errstate(over="ignore"):
        x = (np.asarray(user_keys, np.int64).view(np.uint64)
             ^ (np.asarray(item_keys, np.int64).view(np.uint64) * GOLDEN))
        x = x ^ (x >> np.uint64(30))
        x = x * MIX1
        x = x ^ (x >> np.uint64(27))
        x = x * MIX2
        x = x ^ (x >> np.uint64(31))
    return x.view(np.int64)
