"""vaecf.data.split: proportions, item universe, determinism, invariance to row order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vaecf.data.split import SplitConfig, split_interactions, write_split
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
    result = split_interactions(_pairs(), SplitConfig(seed=1, heldout_users=100))
    assert result.users["split"].value_counts().to_dict() == {"train": 800, "val": 100,
                                                               "test": 100}


def test_too_few_users_is_an_error() -> None:
    with pytest.raises(VaecfError, match="too few users"):
        split_interactions(_pairs(n_users=5), SplitConfig(seed=1))
