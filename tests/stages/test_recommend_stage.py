"""``vaecf recommend``: raw ids in (Parquet or CSV), top-k raw item ids out, own items never."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from vaecf.io import sha256_file
from vaecf.stages.recommend import read_pairs


@pytest.fixture(scope="module")
def model(small_model: Path) -> Path:
    return small_model


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
    code, out, err = cli("recommend", "--model", model, "--input", tmp_path / "in.csv",
                         "--output", tmp_path / "out", "--top-k", "3")
    assert code == 0
    assert "3 recommendations for 1 users" in out and "1 pairs with an unknown item" in out
    assert err == ("vaecf recommend: warning: 1 of 1 pairs name an item the model was not "
                   "trained on; ignored\n")
    manifest = pd.read_json(tmp_path / "out" / "recommend_manifest.json", typ="series")
    assert manifest["counts"]["unknown_item_pairs"] == 1


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_ids_written_as_floats_are_the_integer_ids(model: Path, tmp_path: Path, cli,
                                                   suffix: str) -> None:
    items = item_ids(model)
    assert items.dtype.kind == "i"  # the synthetic dataset's raw ids are integers
    pairs = pd.DataFrame({"user_id": [1, 1], "item_id": items[:2].astype(np.float64)})
    path = tmp_path / f"in{suffix}"
    pairs.to_csv(path, index=False) if suffix == ".csv" else pairs.to_parquet(path)
    read = read_pairs(path)["item_id"]  # read back as 4.0, not 4
    assert list(read.astype(str)) == [f"{item}.0" for item in items[:2]]
    code, out, err = cli("recommend", "--model", model, "--input", path,
                         "--output", tmp_path / "out", "--top-k", str(items.size - 2))
    assert (code, err) == (0, ""), err
    result = pd.read_parquet(tmp_path / "out" / "recommendations.parquet")
    assert sorted(result["item_id"]) == sorted(items[2:])  # every item but the user's own
    assert "(0 pairs with an unknown item ignored)" in out


def test_user_ids_are_text_so_007_and_7_are_two_users(model: Path, tmp_path: Path,
                                                     cli) -> None:
    """A CSV's ids are text as written (pandas read both as the integer 7 and merged the two
    users' items)."""
    items = item_ids(model)
    (tmp_path / "in.csv").write_text(f"user_id,item_id\n007,{items[0]}\n7,{items[1]}\n"
                                     f"7,{items[2]}\n")
    code, out, err = cli("recommend", "--model", model, "--input", tmp_path / "in.csv",
                         "--output", tmp_path / "out", "--top-k", str(items.size - 2))
    assert (code, err) == (0, ""), err
    assert "for 2 users" in out
    result = pd.read_parquet(tmp_path / "out" / "recommendations.parquet")
    assert list(result["user_id"].unique()) == ["007", "7"]  # ascending as text
    first = set(result[result["user_id"] == "007"]["item_id"])
    assert len(first) == items.size - 2 and items[0] not in first
    assert set(result[result["user_id"] == "7"]["item_id"]) == set(items) - set(items[1:3])


def test_top_k_above_the_model_items_is_refused(model: Path, tmp_path: Path, cli) -> None:
    n_items = item_ids(model).size
    pd.DataFrame({"user_id": [1], "item_id": [item_ids(model)[0]]}).to_csv(
        tmp_path / "in.csv", index=False)
    code, _, err = cli("recommend", "--model", model, "--input", tmp_path / "in.csv",
                       "--output", tmp_path / "out", "--top-k", "1000000")
    assert code == 1
    assert err == (f"vaecf recommend: error: --top-k 1000000: the model scores "
                   f"{n_items:,} items (use at most {n_items})\n")
    assert not (tmp_path / "out").exists()


def test_item_index_that_does_not_match_the_model_is_refused(model: Path, tmp_path: Path,
                                                             cli) -> None:
    """An item index of another length (kept consistent with the manifest's checksums)
    would map raw ids onto the wrong model outputs."""
    copy = tmp_path / "model"
    shutil.copytree(model, copy)
    index = pq.read_table(copy / "item_index.parquet").slice(1)
    pq.write_table(index, copy / "item_index.parquet")
    manifest = json.loads((copy / "train_manifest.json").read_text())
    manifest["files"]["item_index.parquet"]["sha256"] = sha256_file(copy / "item_index.parquet")
    (copy / "train_manifest.json").write_text(json.dumps(manifest))
    pd.DataFrame({"user_id": [1], "item_id": [index["item_id"][0].as_py()]}).to_csv(
        tmp_path / "in.csv", index=False)
    code, _, err = cli("recommend", "--model", copy, "--input", tmp_path / "in.csv",
                       "--output", tmp_path / "out")
    assert code == 1
    assert err == (f"vaecf recommend: error: {copy / 'item_index.parquet'}: does not list "
                   f"item_idx 0 .. n_items - 1 in order (train_manifest.json has n_items "
                   f"{manifest['n_items']})\n")
    assert not (tmp_path / "out").exists()


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


def test_a_model_exported_without_its_id_map_is_refused_in_one_line(model: Path, tmp_path: Path,
                                                                     cli) -> None:
    """A SavedModel of an earlier vaecf (no item id map, no recommend_ids) is refused: the
    raw ids are read through the SavedModel's own map, never guessed."""
    import tensorflow as tf

    class Earlier(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="row_splits"),
                                      tf.TensorSpec([None], tf.int64, name="item_idx"),
                                      tf.TensorSpec([], tf.int32, name="k")])
        def recommend(self, row_splits, item_idx, k):  # type: ignore[no-untyped-def]
            return {"item_idx": tf.zeros([1, 1], tf.int32), "scores": tf.zeros([1, 1])}

    copy = tmp_path / "model"
    shutil.copytree(model, copy)
    shutil.rmtree(copy / "saved_model")
    earlier = Earlier()
    tf.saved_model.save(earlier, str(copy / "saved_model"),
                        signatures={"recommend": earlier.recommend})
    manifest = json.loads((copy / "train_manifest.json").read_text())
    files = {k: v for k, v in manifest["files"].items() if not k.startswith("saved_model/")}
    for path in sorted((copy / "saved_model").rglob("*")):
        if path.is_file():
            files[str(path.relative_to(copy))] = {"bytes": path.stat().st_size,
                                                   "sha256": sha256_file(path)}
    manifest["files"] = files
    (copy / "train_manifest.json").write_text(json.dumps(manifest))
    pd.DataFrame({"user_id": [1], "item_id": [item_ids(model)[0]]}).to_csv(
        tmp_path / "in.csv", index=False)
    code, _, err = cli("recommend", "--model", copy, "--input", tmp_path / "in.csv",
                       "--output", tmp_path / "out")
    assert code == 1
    assert err == (f"vaecf recommend: error: {copy / 'saved_model'}: this SavedModel has no "
                   "item id map (exported by an older vaecf); train it again with this "
                   "version\n")
    assert not (tmp_path / "out").exists()
