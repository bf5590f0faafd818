"""vaecf.data.split: proportions, item universe, determinism, invariance to row order and
chunking, and the keyed rule itself, checked against ``split_keys`` by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vaecf.data import split as split_module
from vaecf.data.split import SplitConfig, split_interactions, write_split
from vaecf.data.split_keys import SPLIT_FUNCTION, pair_keys, text_keys
from vaecf.data.splits import load_split
from vaecf.errors import VaecfError


def _pairs(n_users: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Users with 3..30 items each, ids neither contiguous nor sorted."""
    rng = np.random.default_rng(seed)
    rows = []
    for user in rng.permutation(n_users) * 7 + 11:
        items = rng.choice(400, size=rng.integers(3, 31), replace=False) * 3 + 1000
        rows.append(pd.DataFrame({"user_id": user, "item_id": items}))
    return pd.concat(rows, ignore_index=True)


def _write(result, directory: Path) -> Path:  # type: ignore[no-untyped-def]
    directory.mkdir()
    write_split(result, directory, inputs={}, parameters={}, started=0.0)
    return directory


def test_proportions_and_holdout_rule() -> None:
    pairs = _pairs()
    result = split_interactions(pairs, SplitConfig(seed=1))
    users = result.users["split"].value_counts()
    assert users["val"] == 70 and users["test"] == 70 and users["train"] == 860
    per_user = (result.pairs.groupby(["user_idx", "part"], observed=False).size()
                .unstack(fill_value=0))
    heldout = per_user[per_user["train"] == 0]
    for split in ("val", "test"):
        rows = heldout[(heldout[f"{split}_fold_in"] + heldout[f"{split}_holdout"]) > 0]
        total = rows[f"{split}_fold_in"] + rows[f"{split}_holdout"]
        assert (rows[f"{split}_holdout"] == np.floor(0.2 * total)).all()
        assert result.counts[f"{split}_users_without_holdout"] == int((total < 5).sum())


def test_item_universe_is_training_items() -> None:
    pairs = _pairs()
    # 40 extra users, each with 6 items nobody else has: held out, they lose all their items.
    owners = np.arange(1, 41)
    extra = pd.DataFrame({"user_id": -np.repeat(owners, 6),
                          "item_id": -(np.repeat(owners, 6) * 100 + np.tile(np.arange(6), 40))})
    pairs = pd.concat([pairs, extra], ignore_index=True)
    result = split_interactions(pairs, SplitConfig(seed=1))
    kept = dict(zip(result.users["user_id"], result.users["split"], strict=True))
    extra_heldout = [u for u in -owners if u not in kept]
    assert 0 < len(extra_heldout) < 40  # the seed holds some of them out
    assert all(kept[u] == "train" for u in -owners if u in kept)
    assert result.counts["heldout_users_without_items"] == len(extra_heldout)
    assert result.counts["pairs_outside_item_universe"] == 6 * len(extra_heldout)
    train_items = set(pairs.loc[pairs["user_id"].map(kept) == "train", "item_id"])
    assert set(result.item_ids) == train_items


def test_same_seed_is_byte_identical_and_row_order_free(tmp_path: Path) -> None:
    pairs = _pairs()
    config = SplitConfig(seed=7)
    first = _write(split_interactions(pairs, config), tmp_path / "a")
    shuffled = pairs.sample(frac=1.0, random_state=3)
    second = _write(split_interactions(shuffled, config), tmp_path / "b")
    other = _write(split_interactions(pairs, SplitConfig(seed=8)), tmp_path / "c")
    names = sorted(p.name for p in first.iterdir() if not p.name.endswith(".json"))
    assert len(names) == 12
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert (first / "val_holdout.npz").read_bytes() != (other / "val_holdout.npz").read_bytes()


def test_written_split_loads_consistently(tmp_path: Path) -> None:
    result = split_interactions(_pairs(), SplitConfig(seed=2))
    split = load_split(_write(result, tmp_path / "s"))
    manifest = split.manifest
    assert manifest["user_offset"] == {"train": 0, "val": 860, "test": 930}
    fold_in, holdout = split.heldout("test")
    assert fold_in.multiply(holdout).nnz == 0
    total = split.train.nnz + sum(split.heldout(s)[0].nnz + split.heldout(s)[1].nnz
                                  for s in ("val", "test"))
    assert total == len(result.pairs) == sum(manifest["counts"]["pairs"].values())
    users = pd.read_parquet(split.directory / "user_index.parquet")
    test_users = users[users["split"] == "test"]
    assert test_users["user_idx"].tolist() == list(range(930, 1000))


def test_paper_protocol_holds_out_fixed_counts() -> None:
    """100 + 100 held out: the first 100 users by (key, id text) val, the next 100 test."""
    pairs = _pairs()
    result = split_interactions(pairs, SplitConfig(seed=1, heldout_users=100))
    assert result.users["split"].value_counts().to_dict() == {"train": 800, "val": 100,
                                                               "test": 100}
    ids = sorted(set(pairs["user_id"].tolist()))
    ranked = [u for _, _, u in sorted(zip(text_keys(1, ids).tolist(), map(str, ids), ids,
                                          strict=True))]
    split_of = dict(zip(result.users["user_id"], result.users["split"], strict=True))
    assert {u for u in ids if split_of[u] == "val"} == set(ranked[:100])
    assert {u for u in ids if split_of[u] == "test"} == set(ranked[100:200])


def test_too_few_users_is_an_error() -> None:
    with pytest.raises(VaecfError, match="too few users"):
        split_interactions(_pairs(n_users=5), SplitConfig(seed=1))


def _placement(result) -> tuple[dict[object, str], dict[tuple[object, object], str]]:  # type: ignore[no-untyped-def]
    """(user_id -> split, (user_id, item_id) -> part) of a split result, by raw ids."""
    users = dict(zip(result.users["user_id"], result.users["split"], strict=True))
    user_of_idx = result.users["user_id"].to_numpy()
    pairs = {(user_of_idx[u], result.item_ids[i]): part for u, i, part in zip(
        result.pairs["user_idx"], result.pairs["item_idx"], result.pairs["part"], strict=True)}
    return users, pairs


def test_hand_checked_example() -> None:
    """Ten users (text ids) of 5..8 items: val/test users, the item universe and each holdout
    worked out here from the keys alone, by the rule the Spark engine implements too."""
    seed = 11
    names = ["ann", "bob", "cy", "dee", "eve", "fay", "gus", "hal", "ivy", "jo"]
    owned = {name: list(range(100, 105 + k % 4)) for k, name in enumerate(names)}
    frame = pd.DataFrame([(u, i) for u in names for i in owned[u]],
                         columns=["user_id", "item_id"])
    config = SplitConfig(seed=seed, val_fraction=0.2, test_fraction=0.2, holdout_fraction=0.5)
    got_users, got_pairs = _placement(split_interactions(frame, config))

    user_key = dict(zip(names, text_keys(seed, names).tolist(), strict=True))
    ranked = sorted(names, key=lambda u: (user_key[u], u))
    expected = {u: "val" for u in ranked[:2]} | {u: "test" for u in ranked[2:4]}
    expected |= {u: "train" for u in ranked[4:]}
    universe = {i for u in names if expected[u] == "train" for i in owned[u]}
    expected_pairs = {(u, i): "train" for u in names if expected[u] == "train" for i in owned[u]}
    for user in ranked[:4]:
        items = [i for i in owned[user] if i in universe]
        keys = pair_keys(np.full(len(items), user_key[user]), text_keys(seed, items)).tolist()
        ordered = [i for _, _, i in sorted(zip(keys, map(str, items), items, strict=True))]
        cut = math.floor(0.5 * len(ordered))
        expected_pairs |= {(user, i): f"{expected[user]}_holdout" for i in ordered[:cut]}
        expected_pairs |= {(user, i): f"{expected[user]}_fold_in" for i in ordered[cut:]}
    assert got_users == expected
    assert got_pairs == expected_pairs


def test_ties_are_broken_by_id_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every key equal, users and items fall in the order of their ids' text, where
    "10" < "9" (not the integers' order)."""
    monkeypatch.setattr(split_module, "text_keys",
                        lambda seed, ids: np.zeros(len(list(ids)), dtype=np.int64))
    users = [9, 10, 11, 100, 8, 7, 6, 5, 4, 3]  # by text: 10, 100, 11, 3, 4, ...
    frame = pd.DataFrame([(u, i) for u in users for i in (9, 10, 11, 100, 8)],
                         columns=["user_id", "item_id"])
    config = SplitConfig(seed=0, val_fraction=0.1, test_fraction=0.2, holdout_fraction=0.4)
    got_users, got_pairs = _placement(split_interactions(frame, config))
    assert [u for u in sorted(users) if got_users[u] == "val"] == [10]
    assert [u for u in sorted(users) if got_users[u] == "test"] == [11, 100]
    # Items by text: 10, 100, 11, 8, 9: the first floor(0.4 * 5) = 2 are the holdout.
    assert sorted(i for (u, i), part in got_pairs.items() if u == 10
                  and part == "val_holdout") == [10, 100]


def test_row_order_and_chunking_do_not_matter() -> None:
    """The same pairs in chunks of any size, concatenated in any order, split identically."""
    pairs = _pairs()
    config = SplitConfig(seed=5)
    reference = split_interactions(pairs, config)
    rng = np.random.default_rng(4)
    for size in (3, 97, 4000):
        chunks = [pairs.iloc[i:i + size] for i in range(0, len(pairs), size)]
        frame = pd.concat([chunks[i] for i in rng.permutation(len(chunks))])
        result = split_interactions(frame, config)
        pd.testing.assert_frame_equal(result.users, reference.users)
        pd.testing.assert_frame_equal(result.pairs, reference.pairs)
        assert np.array_equal(result.item_ids, reference.item_ids)


def test_manifest_names_the_split_function(tmp_path: Path) -> None:
    """The manifest records the rule; a split whose manifest lacks it (an earlier version's)
    still loads."""
    directory = _write(split_interactions(_pairs(), SplitConfig(seed=2)), tmp_path / "s")
    path = directory / "dataset_manifest.json"
    manifest = json.loads(path.read_text())
    assert manifest["split_function"] == SPLIT_FUNCTION
    del manifest["split_function"]
    path.write_text(json.dumps(manifest))
    assert "split_function" not in load_split(directory).manifest
