"""Implicit conversion, dedup and filtering, with hand-computed expectations."""

from __future__ import annotations

import numpy as np
import pytest

from vaecf.data.preprocess import FilterConfig, filter_config, keep_frequent, preprocess
from vaecf.data.readers import RawInteractions
from vaecf.errors import VaecfError


def _raw(pairs: list[tuple[int, int]], values: list[float] | None = None,
         kind: str = "rating") -> RawInteractions:
    users, items = zip(*pairs, strict=True)
    return RawInteractions(user_id=np.array(users), item_id=np.array(items),
                           value=np.array(values if values else [5.0] * len(pairs)),
                           kind=kind, files=("test",))


def test_keep_frequent_counts_by_id_not_position() -> None:
    # codes 2 appears 3 times, 0 twice, 1 once; a positional count would misalign them.
    codes = np.array([2, 0, 2, 1, 2, 0])
    assert keep_frequent(codes, 3, 2).tolist() == [True, True, True, False, True, True]


def test_user_filter_counts_by_id_with_unsorted_sparse_ids() -> None:
    """The reference notebook's bug: ``groupby().size()`` then indexing by position.

    User ids are neither 0..n-1 nor in sorted order of appearance: user 900 has 5 items, user
    17 has 1, user 5000 has 5. Only 900 and 5000 may survive ``min_user_items=5``.
    """
    pairs = ([(900, i) for i in (40, 10, 30, 20, 50)] + [(17, 10)]
             + [(5000, i) for i in (50, 40, 30, 20, 10)])
    config = FilterConfig(min_item_users=0, min_user_items=5)
    result = preprocess(_raw(pairs), config)
    assert sorted(set(result.user_id.tolist())) == [900, 5000]
    assert result.counts["user_filter"] == {"rows": 10, "users": 2, "items": 5}
    # Output is sorted by (user_id, item_id) whatever the input order.
    assert result.user_id.tolist() == [900] * 5 + [5000] * 5
    assert result.item_id.tolist() == [10, 20, 30, 40, 50] * 2


def test_item_filter_counts_by_id() -> None:
    # item 70 has 3 users, item 3 has 1 user, item 500 has 2 users.
    pairs = [(1, 70), (2, 70), (3, 70), (1, 3), (2, 500), (3, 500)]
    result = preprocess(_raw(pairs), FilterConfig(min_item_users=2, min_user_items=1))
    assert sorted(set(result.item_id.tolist())) == [70, 500]
    assert result.counts["item_filter"] == {"rows": 5, "users": 3, "items": 2}


def test_implicit_dedup_and_counts_at_every_step() -> None:
    pairs = [(1, 1), (1, 2), (1, 2), (1, 3), (2, 1), (2, 2), (3, 3), (3, 1)]
    values = [4.0, 4.5, 5.0, 3.5, 4.0, 4.0, 1.0, 4.0]
    result = preprocess(_raw(pairs, values), FilterConfig(min_item_users=2, min_user_items=2))
    counts = result.counts
    assert counts["raw"] == {"rows": 8, "users": 3, "items": 3}
    assert counts["implicit"] == {"rows": 6, "users": 3, "items": 2}   # drops 3.5 and 1.0
    assert counts["duplicates"] == 1                                    # (1, 2) twice
    assert counts["dedup"] == {"rows": 5, "users": 3, "items": 2}
    assert counts["item_filter"] == {"rows": 5, "users": 3, "items": 2}
    assert counts["user_filter"] == {"rows": 4, "users": 2, "items": 2}  # user 3 had 1 item
    assert list(zip(result.user_id.tolist(), result.item_id.tolist(), strict=True)) == [
        (1, 1), (1, 2), (2, 1), (2, 2)]


def test_k_core_repeats_until_stable() -> None:
    # One pass: item 9 has 2 users (kept), user 3 has 1 item (dropped), which leaves item 9
    # with 1 user; the k-core's second round drops item 9 and then user 2.
    pairs = [(1, 5), (1, 6), (2, 5), (2, 9), (3, 9), (4, 5), (4, 6)]
    one_pass = preprocess(_raw(pairs), FilterConfig(min_item_users=2, min_user_items=2))
    assert sorted(set(one_pass.user_id.tolist())) == [1, 2, 4]
    k_core = preprocess(_raw(pairs), FilterConfig(min_item_users=2, min_user_items=2,
                                                  k_core=True))
    assert sorted(set(k_core.user_id.tolist())) == [1, 4]
    assert k_core.counts["k_core"]["rounds"] == 3
    assert k_core.counts["output"] == {"rows": 4, "users": 2, "items": 2}


def test_plays_and_implicit_rules() -> None:
    pairs = [(1, 1), (1, 2), (2, 1)]
    plays = preprocess(_raw(pairs, [3.0, 10.0, 5.0], kind="plays"),
                       FilterConfig(min_plays=5, min_item_users=0, min_user_items=1))
    assert plays.counts["implicit"]["rows"] == 2
    implicit = preprocess(_raw(pairs, [0.0, 0.0, 0.0], kind="implicit"),
                          FilterConfig(min_item_users=0, min_user_items=1))
    assert implicit.counts["implicit"]["rows"] == 3


def test_string_ids_are_kept_and_sorted() -> None:
    raw = RawInteractions(user_id=np.array(["b", "a", "b"], dtype=object),
                          item_id=np.array(["x", "y", "y"], dtype=object),
                          value=np.array([1.0, 1.0, 1.0]), kind="plays", files=("t",))
    result = preprocess(raw, FilterConfig(min_item_users=0, min_user_items=1))
    assert result.user_id.tolist() == ["a", "b", "b"]
    assert result.item_id.tolist() == ["y", "x", "y"]


def test_every_user_filtered_out_is_an_error() -> None:
    with pytest.raises(VaecfError, match="every user was filtered out"):
        preprocess(_raw([(1, 1), (2, 2)]), FilterConfig(min_item_users=0, min_user_items=5))
    with pytest.raises(VaecfError, match="no positives"):
        preprocess(_raw([(1, 1)], [1.0]), FilterConfig())


def test_presets_and_overrides() -> None:
    assert filter_config("paper") == FilterConfig(protocol="paper", min_item_users=0)
    assert filter_config("mission", min_item_users=3).min_item_users == 3
    with pytest.raises(VaecfError, match="--protocol: unknown protocol 'x'"):
        filter_config("x")
    with pytest.raises(VaecfError, match="--min-user-items: must be >= 0"):
        filter_config("mission", min_user_items=-1)
