"""``vaecf split`` end to end: determinism, fractions, fold_in/holdout, item universe."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import boto3
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
import stage_checks

from vaecf.data.splits import load_split, matrix_names, save_parquet
from vaecf.io import read_manifest, write_manifest

N_USERS = 500


def _pairs(seed: int = 0) -> pd.DataFrame:
    """500 users (sparse, unsorted ids) with 5..40 distinct items each among 300."""
    rng = np.random.default_rng(seed)
    user_ids = rng.choice(np.arange(10_000, 90_000), N_USERS, replace=False)
    rows = [(u, i) for u in user_ids
            for i in rng.choice(np.arange(1, 301) * 7, rng.integers(5, 41), replace=False)]
    return pd.DataFrame(rows, columns=["user_id", "item_id"])


def interactions(directory: Path, frame: pd.DataFrame, dataset: str = "synthetic",
                 protocol: str | None = None, row_group_size: int | None = None) -> Path:
    """A preprocess output directory holding ``frame`` (as ``vaecf preprocess`` writes it, or
    in row groups of ``row_group_size`` rows)."""
    directory.mkdir(parents=True)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if row_group_size is None:
        save_parquet(directory / "interactions.parquet", table)
    else:
        pq.write_table(table, directory / "interactions.parquet", row_group_size=row_group_size)
    write_manifest(directory, "preprocess", inputs={}, counts={}, started=0.0,
                   parameters={"protocol": protocol} if protocol else {},
                   extra={"dataset": dataset})
    return directory


def _split(cli, source: Path, output: Path, *flags: object) -> Path:  # type: ignore[no-untyped-def]
    code, _, err = cli("split", "--input", source, "--output", output, *flags)
    assert code == 0, err
    return output


def _data_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())
            if p.name != "dataset_manifest.json"}


assert_failed = partial(stage_checks.assert_failed, "split")


def test_same_seed_and_shuffled_rows_give_identical_files(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Same seed, shuffled rows, or rows in many small row groups: the same bytes."""
    frame = _pairs()
    source = interactions(tmp_path / "in", frame)
    shuffled = interactions(tmp_path / "shuffled", frame.sample(frac=1.0, random_state=3))
    chunked = interactions(tmp_path / "chunked", frame.sample(frac=1.0, random_state=4),
                           row_group_size=37)
    assert pq.ParquetFile(chunked / "interactions.parquet").num_row_groups > 100
    first = _split(cli, source, tmp_path / "a", "--seed", 5)
    again = _split(cli, source, tmp_path / "b", "--seed", 5)
    from_shuffled = _split(cli, shuffled, tmp_path / "c", "--seed", 5)
    from_chunked = _split(cli, chunked, tmp_path / "e", "--seed", 5)
    other_seed = _split(cli, source, tmp_path / "d", "--seed", 6)
    assert (_data_files(first) == _data_files(again) == _data_files(from_shuffled)
            == _data_files(from_chunked))
    assert _data_files(first)["train.npz"] != _data_files(other_seed)["train.npz"]
    manifests = [json.loads((d / "dataset_manifest.json").read_text()) for d in (first, again)]
    assert manifests[0].pop("run") and manifests[1].pop("run")
    assert manifests[0] == manifests[1]
    assert set(_data_files(first)) == {f"{m}.{ext}" for m in matrix_names()
                                       for ext in ("npz", "parquet")} | {
        "user_index.parquet", "item_index.parquet"}


def test_fractions_holdout_and_item_universe(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    frame = _pairs()
    split = load_split(_split(cli, interactions(tmp_path / "in", frame), tmp_path / "out"))
    users = split.manifest["n_users"]
    dropped = split.manifest["counts"]["heldout_users_without_items"]
    assert users["val"] + dropped >= round(0.07 * N_USERS) == 35 >= users["val"]
    assert users["test"] <= 35 and users["train"] == N_USERS - 70
    index = pq.read_table(tmp_path / "out" / "user_index.parquet").to_pandas()
    train_ids = index.loc[index["split"] == "train", "user_id"]
    train_items = np.unique(frame.loc[frame["user_id"].isin(train_ids), "item_id"])
    assert np.array_equal(split.item_ids, train_items)  # item universe = training items
    for subset in ("val", "test"):
        fold_in, holdout = split.heldout(subset)
        sizes = np.diff(fold_in.indptr) + np.diff(holdout.indptr)
        assert np.array_equal(np.diff(holdout.indptr), np.floor(0.2 * sizes))
        assert (fold_in.multiply(holdout)).nnz == 0


def test_custom_fractions(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = _split(cli, interactions(tmp_path / "in", _pairs()), tmp_path / "out",
                 "--val-fraction", 0.1, "--test-fraction", 0.2, "--holdout-fraction", 0.5)
    manifest = read_manifest(out, "dataset")
    assert manifest["n_users"]["train"] == N_USERS - 50 - 100
    fold_in = sp.load_npz(out / "test_fold_in.npz")
    holdout = sp.load_npz(out / "test_holdout.npz")
    sizes = np.diff(fold_in.indptr) + np.diff(holdout.indptr)
    assert np.array_equal(np.diff(holdout.indptr), np.floor(0.5 * sizes))


def test_paper_protocol_held_out_counts(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    small_ml20m = interactions(tmp_path / "in", _pairs(), dataset="ml-20m")
    result = cli("split", "--input", small_ml20m, "--output", tmp_path / "out",
                 "--protocol", "paper")
    assert_failed(result, tmp_path / "out", "cannot hold out 10000 val + 10000 test users of 500")
    out = _split(cli, small_ml20m, tmp_path / "ok", "--protocol", "paper", "--heldout-users", 40)
    manifest = read_manifest(out, "dataset")
    assert manifest["parameters"]["heldout_users"] == 40
    assert manifest["parameters"]["protocol"] == "paper"
    assert manifest["n_users"]["train"] == N_USERS - 80


def test_split_inherits_the_preprocess_protocol_and_records_an_override(cli, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                       capsys) -> None:
    """preprocess --protocol paper then a plain split: a paper split, not a silent mission."""
    paper = interactions(tmp_path / "in", _pairs(), dataset="ml-20m", protocol="paper")
    inherited = read_manifest(_split(cli, paper, tmp_path / "a", "--heldout-users", 40),
                              "dataset")["parameters"]
    assert (inherited["protocol"], inherited["protocol_source"]) == ("paper", "preprocess")
    code, _, err = cli("split", "--input", paper, "--output", tmp_path / "b",
                       "--protocol", "mission")
    assert code == 0, err
    assert "--protocol mission overrides the protocol 'paper' that preprocess recorded" in err
    overridden = read_manifest(tmp_path / "b", "dataset")["parameters"]
    assert (overridden["protocol"], overridden["protocol_source"],
            overridden["preprocess_protocol"]) == ("mission", "--protocol", "paper")
    assert overridden["heldout_users"] is None  # the fractions, as mission says
    plain = interactions(tmp_path / "plain", _pairs())
    default = read_manifest(_split(cli, plain, tmp_path / "c"), "dataset")["parameters"]
    assert (default["protocol"], default["protocol_source"]) == ("mission", "default")


def test_input_manifest_missing_or_not_matching(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source = interactions(tmp_path / "in", _pairs())
    save_parquet(source / "interactions.parquet", pa.Table.from_pandas(_pairs(1)))
    assert_failed(cli("split", "--input", source, "--output", tmp_path / "out"),
                  tmp_path / "out", "interactions.parquet: SHA-256 does not match")
    (source / "preprocess_manifest.json").unlink()
    assert_failed(cli("split", "--input", source, "--output", tmp_path / "out"),
                  tmp_path / "out", "preprocess_manifest.json: manifest missing")


def test_manifest_listing_no_files_and_missing_parquet(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source = tmp_path / "in"
    source.mkdir()
    write_manifest(source, "preprocess", inputs={}, parameters={}, counts={}, started=0.0)
    assert_failed(cli("split", "--input", source, "--output", tmp_path / "out"),
                  tmp_path / "out", f"{source / 'interactions.parquet'}: not listed in "
                  f"preprocess_manifest.json (is {source} the output of 'vaecf preprocess'?)")


@pytest.mark.parametrize(("flags", "expected"), [
    (["--seed", "-1"], "argument --seed: expected an integer from 0 to"),
    (["--val-fraction", "1.5"], "--val-fraction 1.5: expected 0..1"),
    (["--val-fraction", "0.6", "--test-fraction", "0.5"], "--val-fraction + --test-fraction"),
    (["--protocol", "x"], "--protocol: unknown protocol 'x'"),
    (["--heldout-users", "0"], "--heldout-users 0: expected 1.."),
])
def test_bad_flags(cli, tmp_path: Path, flags: list[str], expected: str) -> None:  # type: ignore[no-untyped-def]
    source = interactions(tmp_path / "in", _pairs())
    assert_failed(cli("split", "--input", source, "--output", tmp_path / "out", *flags),
                  tmp_path / "out", expected)


def test_data_stages_chain_through_s3(cli, s3_bucket: str) -> None:  # type: ignore[no-untyped-def]
    """download -> preprocess -> split with every input and output in object storage."""
    prefix = f"s3://{s3_bucket}"
    for argv in (["download", "--dataset", "synthetic", "--synthetic-users", 200,
                  "--synthetic-items", 80, "--output", f"{prefix}/raw"],
                 ["preprocess", "--input", f"{prefix}/raw", "--output", f"{prefix}/inter"],
                 ["split", "--input", f"{prefix}/inter", "--output", f"{prefix}/split"]):
        code, _, err = cli(*argv)
        assert code == 0, err
    keys = {o["Key"] for o in boto3.client("s3").list_objects_v2(
        Bucket=s3_bucket, Prefix="split/")["Contents"]}
    assert {"split/_SUCCESS", "split/dataset_manifest.json", "split/train.npz"} <= keys
