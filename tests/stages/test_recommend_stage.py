"""``vaecf recommend``: raw ids in (Parquet or CSV), top-k raw item ids out, own items never."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from vaecf.cli import main


@pytest.fixture(scope="module")
def model(synthetic_split, tmp_path_factory: pytest.TempPathFactory) -> Path:
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    output = tmp_path_factory.mktemp("recommend") / "model"
    assert main(["train", "--split", str(split), "--output", str(output), "--epochs", "2",
                 "--batch-size", "100", "--hidden", "32", "--latent", "8"]) == 0
    return output


def item_ids(model: Path) -> np.ndarray:
    return pq.read_table(model / "item_index.parquet").column("item_id").to_numpy()


def test_parquet_and_csv_give_top_k_without_own_items(model: Path, tmp_path: Path, cli) -> None:
    items = item_ids(model)
    pairs = pd.DataFrame({"user_id": ["u2", "u2", "u1"],
                          "item_id": [items[0], items[1], items[2]]})
    pairs.to_csv(tmp_path / "users.csv", index=False)
    pairs.to_parquet(tmp_path / "users.parquet")
    own = {"u1": {items[2]}, "u2": {items[0], items[1]}}
    for name in ("users.csv", "users.parquet"):
        output = tmp_path / name.replace(".", "-")
        code, out, err = cli("recommend", "--model", model, "--input", tmp_path / name,
                             "--output", output, "--top-k", "5")
        assert code == 0, err
        assert "10 recommendations for 2 users" in out
        result = pd.read_parquet(output / "recommendations.parquet")
        assert list(result["user_id"]) == ["u1"] * 5 + ["u2"] * 5  # ascending user_id
        assert list(result["rank"]) == [1, 2, 3, 4, 5] * 2
        assert set(result["item_id"]) <= set(items)
        for user, known in own.items():
            mine = result[result["user_id"] == user]
            assert not set(mine["item_id"]) & known
            assert mine["score"].is_monotonic_decreasing
    csv = pd.read_parquet(tmp_path / "users-csv" / "recommendations.parquet")
    pd.testing.assert_frame_equal(csv, result)


def test_unknown_item_is_counted_and_user_still_served(model: Path, tmp_path: Path,
                                                       cli) -> None:
    pd.DataFrame({"user_id": [7], "item_id": ["nope"]}).to_csv(tmp_path / "in.csv", index=False)
    code, out, _ = cli("recommend", "--model", model, "--input", tmp_path / "in.csv",
                       "--output", tmp_path / "out", "--top-k", "3")
    assert code == 0
    assert "3 recommendations for 1 users" in out and "1 pairs with an unknown item" in out
    manifest = pd.read_json(tmp_path / "out" / "recommend_manifest.json", typ="series")
    assert manifest["counts"]["unknown_item_pairs"] == 1


@pytest.mark.parametrize(("content", "message"), [
    ("user,item_id\n1,2\n", "missing column(s) user_id (expected user_id,item_id; "
                            "found user,item_id)"),
    ("user_id,item_id\n", "no rows"),
    ("user_id,item_id\n1,2\n3,\n", "row 2: empty user_id or item_id"),
])
def test_bad_input_names_the_problem_and_writes_nothing(model: Path, tmp_path: Path, cli,
                                                        content: str, message: str) -> None:
    (tmp_path / "in.csv").write_text(content)
    code, _, err = cli("recommend", "--model", model, "--input", tmp_path / "in.csv",
                       "--output", tmp_path / "out")
    assert code == 1
    assert err.strip() == f"vaecf recommend: error: {tmp_path / 'in.csv'}: {message}"
    assert not (tmp_path / "out").exists()
