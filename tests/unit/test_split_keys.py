"""The split's keys are fixed values of the data and the seed, the same in every engine."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from vaecf.data.split_keys import id_text, pair_keys, text_keys


def reference_key(seed: int, text: str) -> int:
    """SHA-256's first 8 bytes as a signed 64-bit integer, written out longhand."""
    digest = hashlib.sha256(f"{seed}\x1f{text}".encode()).hexdigest()
    unsigned = int(digest[:16], 16)
    return unsigned - (1 << 64) if unsigned >= 1 << 63 else unsigned


def reference_pair(user_key: int, item_key: int) -> int:
    """SplitMix64's finaliser over user ^ item * golden, in Python's unbounded integers."""
    mask = (1 << 64) - 1
    x = (user_key & mask) ^ (((item_key & mask) * 0x9E3779B97F4A7C15) & mask)
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & mask
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & mask
    x ^= x >> 31
    return x - (1 << 64) if x >= 1 << 63 else x


def test_text_keys_match_the_definition() -> None:
    ids = ["007", "7", "user é", ""]
    keys = text_keys(1, ids)
    assert keys.dtype == np.int64
    assert keys.tolist() == [reference_key(1, t) for t in ids]
    assert keys[0] != keys[1]  # text ids stay text: 007 and 7 are two users


def test_integer_ids_hash_as_their_digits() -> None:
    assert text_keys(5, np.array([7, -3], np.int64)).tolist() == text_keys(5, ["7", "-3"]).tolist()
    assert text_keys(5, [7]).tolist() != text_keys(6, [7]).tolist()


def test_known_values() -> None:
    # Literals, so that no change of definition (hash, prefix, byte order, sign) can pass:
    # sha256("1\x1f42") begins e96a2ffe2d18cf17.
    assert text_keys(1, [42]).tolist() == [-1627435546616213737]
    assert pair_keys(np.array([1]), np.array([2])).tolist() == [-4689498862643123097]


def test_pair_keys_match_the_definition() -> None:
    rng = np.random.default_rng(0)
    users = rng.integers(-(2**63), 2**63 - 1, size=200, dtype=np.int64)
    items = rng.integers(-(2**63), 2**63 - 1, size=200, dtype=np.int64)
    got = pair_keys(users, items)
    assert got.tolist() == [reference_pair(int(u), int(i))
                            for u, i in zip(users, items, strict=True)]


@pytest.mark.parametrize("bad", [True, 1.5, None, b"7"])
def test_ids_are_text_or_integers(bad: object) -> None:
    with pytest.raises(TypeError):
        id_text(bad)
