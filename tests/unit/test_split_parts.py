"""A split in the parts layout (the Spark engine's ``s3://`` output: each table as sorted
Parquet parts that the manifest lists; no NPZ) loads as the same ``Split`` as its files, each
rank reading the parts that hold its share alone; an edited listing is one line naming the
file.

The parts are cut here from a split of the real split code (``synthetic_split``), at rows
inside a user's pairs, as a cluster's range partitions may cut them."""

from __future__ import annotations

import json
import shutil
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vaecf.data.split_files import part_entries
from vaecf.data.splits import (
    PART_FILES,
    ROW_GROUPS,
    Split,
    load_split,
    matrix_names,
    save_parquet_batches,
    user_share,
)
from vaecf.errors import VaecfError
from vaecf.io.manifest import sha256_file

TABLES = [*matrix_names(), "user_index", "item_index"]
SHARES = 4


def as_parts(files: Path, out: Path, cuts: dict[str, list[int]], parts: int = 5,
             group_rows: int = 1 << 20) -> Path:
    """``files`` (a split of one file per table) in the parts layout at ``out``: each table
    cut at the rows ``cuts`` lists, else into ``parts`` parts of about equal rows; each part
    in row groups of ``group_rows``."""
    manifest = json.loads((files / "dataset_manifest.json").read_text())
    out.mkdir()
    listing: dict[str, list[dict[str, Any]]] = {}
    written: dict[str, dict[str, Any]] = {}
    for table in TABLES:
        rows = pq.read_table(files / f"{table}.parquet")
        reported: dict[str, dict[str, Any]] = {}
        every = np.arange(rows.num_rows)
        pieces = (np.split(every, cuts[table]) if table in cuts
                  else np.array_split(every, parts))
        for n, cut in enumerate(pieces):
            if not len(cut):
                continue
            name = f"{table}/part-{n:05d}.parquet"
            (out / table).mkdir(exist_ok=True)
            piece = rows.slice(int(cut[0]), len(cut))
            for _ in save_parquet_batches(out / name, rows.schema, piece.to_batches(),
                                          group_rows):
                pass
            keys = piece.column(0).to_numpy()
            starts = range(0, len(keys), group_rows)
            reported[name] = {"rows": len(keys), "row_groups": [
                [int(keys[s]), min(group_rows, len(keys) - s)] for s in starts]}
            written[name] = {"sha256": sha256_file(out / name),
                             "bytes": (out / name).stat().st_size}
        listing[f"{table}.parquet"] = part_entries(reported)
    del manifest[ROW_GROUPS]
    manifest.update({PART_FILES: listing, "files": written})
    _write_manifest(out, manifest)
    return out


def _write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    (directory / "dataset_manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def both(synthetic_split, tmp_path_factory: pytest.TempPathFactory  # type: ignore[no-untyped-def]
         ) -> tuple[Path, Path]:
    """(the files, the same split as parts): 600 users, 5 parts a table, one row group
    a part; training's cut inside the first user of each quarter of the training users (a
    rank's share of 4): each such user straddles two parts."""
    files = synthetic_split()
    rows = load_split(files).train.indptr
    firsts = [user_share(len(rows) - 1, SHARES, k).start for k in range(1, SHARES)]
    assert all(rows[u + 1] - rows[u] >= 2 for u in firsts)
    cuts = {"train": [int(rows[u]) + 1 for u in firsts]}
    return files, as_parts(files, tmp_path_factory.mktemp("parts") / "s", cuts)


def _same(a: Split, b: Split) -> None:
    for name in matrix_names():
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape and x.dtype == y.dtype, name
        for array in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(x, array), getattr(y, array), err_msg=name)
    assert a.item_ids.tolist() == b.item_ids.tolist()
    assert (a.train_first, a.n_train_users, a.n_train_pairs) == (b.train_first,
                                                                  b.n_train_users,
                                                                  b.n_train_pairs)


def test_a_split_of_parts_loads_as_its_files(both: tuple[Path, Path], tmp_path: Path) -> None:
    files, parts = both
    assert not list(parts.glob("*.npz")) and not list(parts.glob("*.parquet"))
    train = json.loads((parts / "dataset_manifest.json").read_text())[PART_FILES]["train.parquet"]
    users = [pq.read_table(parts / p["name"]).column("user_idx").to_numpy() for p in train]
    assert any(a[-1] == b[0] for a, b in pairwise(users))  # a user straddles two parts
    whole, loaded = load_split(files), load_split(parts)
    _same(loaded, whole)
    assert loaded.train_rows_read == whole.train.nnz
    assert loaded.user_index().to_pydict() == whole.user_index().to_pydict()
    loaded.write_item_index(tmp_path / "parts.parquet")
    whole.write_item_index(tmp_path / "files.parquet")
    assert (tmp_path / "files.parquet").read_bytes() == (files / "item_index.parquet").read_bytes()
    assert pq.read_table(tmp_path / "parts.parquet").equals(pq.read_table(tmp_path /
                                                                          "files.parquet"))


def test_each_share_reads_only_the_parts_that_hold_it(both: tuple[Path, Path]) -> None:
    files, parts = both
    whole = load_split(files)
    listed = json.loads((parts / "dataset_manifest.json").read_text())[PART_FILES]
    spans = [(int(u.min()), int(u.max()), len(u)) for u in
             (pq.read_table(parts / p["name"]).column("user_idx").to_numpy()
              for p in listed["train.parquet"])]
    held = 0
    for share in range(SHARES):
        users = user_share(whole.n_train_users, SHARES, share)
        loaded = load_split(parts, train_share=(share, SHARES))
        _same(loaded, Split(**{**whole.__dict__, "train": whole.train[users.start:users.stop],
                               "train_first": users.start}))
        # the parts whose users meet the share, and no other
        assert loaded.train_rows_read == sum(rows for low, high, rows in spans
                                             if low < users.stop and high >= users.start)
        assert loaded.train_rows_read < 0.6 * whole.train.nnz
        held += loaded.train.nnz
    assert held == whole.train.nnz


def _edited(parts: Path, tmp_path: Path, edit: str) -> Path:
    """A copy of ``parts`` with one thing wrong (checksums kept right: the listing or the
    part's rows are what is wrong)."""
    copy = Path(shutil.copytree(parts, tmp_path / "copy"))
    manifest = json.loads((copy / "dataset_manifest.json").read_text())
    listing = manifest[PART_FILES]
    train = listing["train.parquet"]
    if edit == "missing":
        (copy / train[2]["name"]).unlink()
        del manifest["files"][train[2]["name"]]
    elif edit == "order":
        train[1], train[2] = train[2], train[1]
    elif edit == "first":
        train[1]["first"] += 1
    elif edit == "count":
        manifest["counts"]["pairs"]["val_holdout"] += 1
    else:  # the rows of a part: a user's items reversed, or an item beyond n_items
        path = copy / listing["val_fold_in.parquet"][1]["name"]
        table = pq.read_table(path)
        item = table.column("item_idx").to_numpy().copy()
        if edit == "unsorted":
            item[:2] = item[1::-1]
        else:
            item[-1] = manifest["n_items"]
        pq.write_table(table.set_column(1, "item_idx", pa.array(item, pa.int32())), path)
        manifest["files"][listing["val_fold_in.parquet"][1]["name"]]["sha256"] = \
            sha256_file(path)
    _write_manifest(copy, manifest)
    return copy


@pytest.mark.parametrize(("edit", "message"), [
    ("missing", r"train/part-00002\.parquet: not listed in dataset_manifest\.json"),
    ("order", r"'parts': train\.parquet: train/part-00001\.parquet: its row groups start "
              r"before those listed ahead of them"),
    ("first", r"'parts': train\.parquet: train/part-00001\.parquet: its 'rows' and 'first' "
              r"are not those of its 'row_groups'"),
    ("count", r"'parts': val_holdout\.parquet: its parts hold [\d,]+ rows, its counts "),
    ("unsorted", r"val_fold_in/part-00001\.parquet: a user's item_idx are not in increasing "
                 r"order"),
    ("item", r"val_fold_in/part-00001\.parquet: item_idx outside 0\.\.\d+ or user_idx"),
])
def test_an_edited_parts_listing_is_one_line(both: tuple[Path, Path], tmp_path: Path,
                                             edit: str, message: str) -> None:
    with pytest.raises(VaecfError, match=message):
        load_split(_edited(both[1], tmp_path, edit))


def test_a_rank_fetches_from_s3_only_the_parts_of_its_share(both: tuple[Path, Path],
                                                            s3_bucket: str) -> None:
    """From ``s3://`` each share downloads the training parts that hold it and every other
    table, nothing more, and verifies what it fetched: a part it does not read may be
    anything, one it reads must match its checksum."""
    from vaecf.data.splits import open_split
    from vaecf.io import storage

    files, parts = both
    uri = f"s3://{s3_bucket}/split"
    storage.upload_dir(parts, uri, first="dataset_manifest.json")
    listing = json.loads((parts / "dataset_manifest.json").read_text())
    train = [p["name"] for p in listing[PART_FILES]["train.parquet"]]
    others = sorted(set(listing["files"]) - set(train))
    whole = load_split(files)
    fetched = []
    for share in range(SHARES):
        users = user_share(whole.n_train_users, SHARES, share)
        with open_split(uri, train_share=(share, SHARES)) as loaded:
            held = sorted(p.relative_to(loaded.directory).as_posix()
                          for p in loaded.directory.rglob("*.parquet"))
            _same(loaded, Split(**{**whole.__dict__, "train": whole.train[users.start:users.stop],
                                   "train_first": users.start}))
            assert loaded.user_index().num_rows == sum(listing["n_users"].values())
        fetched.append([name for name in held if name in train])
        assert sorted(set(held) - set(fetched[-1])) == others
        assert not loaded.directory.exists()  # the download is removed on exit
    # a straddling user puts a part in two shares; no share fetches every part
    assert all(0 < len(f) < len(train) for f in fetched)
    assert sorted({name for f in fetched for name in f}) == sorted(train)
    unread = next(name for name in train if name not in fetched[0])
    storage.client().put_object(Bucket=s3_bucket, Key=f"split/{unread}", Body=b"not parquet")
    with open_split(uri, train_share=(0, SHARES)) as loaded:
        assert loaded.train.nnz == whole.train[:user_share(whole.n_train_users, SHARES,
                                                           0).stop].nnz
    with pytest.raises(VaecfError, match=rf"^{uri}/{unread}: SHA-256 does not match "
                                         r"dataset_manifest\.json$"), open_split(uri):
        pass
