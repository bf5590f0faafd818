"""The split's training pairs by row group: each Horovod rank reads only its share."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from vaecf.data.split import SplitConfig, split_interactions, write_split
from vaecf.data.splits import ROW_GROUPS, load_split, row_group_rows, user_share
from vaecf.errors import VaecfError
from vaecf.io.readers import INDEX, read_parquet


def _pairs() -> pd.DataFrame:
    """1,000 users with 3..30 items each (about 14,000 training pairs)."""
    rng = np.random.default_rng(0)
    sizes = rng.integers(3, 31, size=1000)
    return pd.DataFrame({"user_id": np.repeat(rng.permutation(1000) * 7 + 11, sizes),
                         "item_id": np.concatenate([rng.choice(400, size=k, replace=False)
                                                    for k in sizes]) * 3 + 1000})


@pytest.fixture(scope="module")
def split_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("split") / "s"
    directory.mkdir()
    write_split(split_interactions(_pairs(), SplitConfig(seed=1)), directory, inputs={},
                parameters={}, started=0.0)
    return directory


def _copy(split_dir: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(split_dir, tmp_path / "copy"))


def test_train_parquet_is_written_in_the_row_groups_its_manifest_lists(
        split_dir: Path, tmp_path: Path) -> None:
    manifest = json.loads((split_dir / "dataset_manifest.json").read_text())
    groups = manifest[ROW_GROUPS]
    nnz = manifest["counts"]["pairs"]["train"]
    rows = row_group_rows(nnz)
    assert rows == 1024 and len(groups) == -(-nnz // rows) > 10
    metadata = pq.ParquetFile(split_dir / "train.parquet").metadata
    users = pq.read_table(split_dir / "train.parquet").column("user_idx").to_numpy()
    assert [[int(users[g * rows]), metadata.row_group(g).num_rows]
            for g in range(metadata.num_row_groups)] == groups
    # byte-deterministic: a second write of the same split is the same file and listing
    again = tmp_path / "again"
    again.mkdir()
    write_split(split_interactions(_pairs(), SplitConfig(seed=1)), again, inputs={},
                parameters={}, started=0.0)
    assert (again / "train.parquet").read_bytes() == (split_dir / "train.parquet").read_bytes()
    assert json.loads((again / "dataset_manifest.json").read_text())[ROW_GROUPS] == groups


def test_each_share_is_read_from_its_row_groups_alone(split_dir: Path) -> None:
    whole = load_split(split_dir)
    n = whole.n_train_users
    rows = row_group_rows(whole.train.nnz)
    held = 0
    for share in range(3):
        part = load_split(split_dir, train_share=(share, 3))
        users = user_share(n, 3, share)
        assert part.train_first == users.start and part.train.shape == (len(users),
                                                                          whole.n_items)
        expected = whole.train[users.start:users.stop]
        assert (part.train != expected).nnz == 0
        np.testing.assert_array_equal(part.train.indptr, expected.indptr)
        np.testing.assert_array_equal(part.train.indices, expected.indices)
        # whole groups are read: at most one group beyond the share at either end
        assert expected.nnz <= part.train_rows_read <= expected.nnz + 2 * rows
        assert part.train_rows_read < 0.5 * whole.train.nnz
        held += part.train.nnz
    assert held == whole.train.nnz


def test_the_reader_reads_only_the_row_groups_asked_for(split_dir: Path,
                                                       tmp_path: Path) -> None:
    """The pages of a group outside the share are never read: destroyed, they are not
    noticed; asked for, they are one line naming the file."""
    path = tmp_path / "train.parquet"
    path.write_bytes((split_dir / "train.parquet").read_bytes())
    metadata = pq.ParquetFile(path).metadata
    listed = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
    last = metadata.num_row_groups - 1
    data = bytearray(path.read_bytes())
    for c in range(metadata.num_columns):
        chunk = metadata.row_group(last).column(c)
        start = chunk.dictionary_page_offset or chunk.data_page_offset
        data[start:start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    path.write_bytes(bytes(data))
    columns = {"user_idx": INDEX, "item_idx": INDEX}
    first = read_parquet(path, columns, row_groups=[0, 1], group_rows=listed)
    assert first.num_rows == listed[0] + listed[1]
    expected = pq.ParquetFile(split_dir / "train.parquet").read_row_groups([0, 1])
    assert first.equals(expected.select(["user_idx", "item_idx"]))
    with pytest.raises(VaecfError, match=r"train\.parquet: not a readable Parquet file"):
        read_parquet(path, columns, row_groups=[last], group_rows=listed)
    with pytest.raises(VaecfError, match=r"train\.parquet: row groups of .* its manifest"):
        read_parquet(path, columns, row_groups=[0], group_rows=listed[:-1])
    with pytest.raises(VaecfError, match=rf"train\.parquet: no row group {last + 1}"):
        read_parquet(path, columns, row_groups=[last + 1])


def test_a_split_made_before_row_groups_is_read_whole_then_sliced(
        split_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = _copy(split_dir, tmp_path)
    manifest = json.loads((old / "dataset_manifest.json").read_text())
    del manifest[ROW_GROUPS]
    (old / "dataset_manifest.json").write_text(json.dumps(manifest))
    whole = load_split(old).train
    part = load_split(old, train_share=(1, 2))
    users = user_share(whole.shape[0], 2, 1)
    assert (part.train != whole[users.start:users.stop]).nnz == 0
    assert part.train_rows_read == whole.nnz
    assert "reading train.npz whole; remake it with 'vaecf split'" in capsys.readouterr().out


@pytest.mark.parametrize("listing,message", [
    ("text", r"'train_row_groups': expected list, found str"),
    ("pairs", r"'train_row_groups': expected \[first user_idx, rows\] pairs"),
    ("rows", r"train\.parquet: row groups of .* not the .* its manifest lists"),
    ("first", r"train\.parquet: its rows are not sorted by user_idx from the first users"),
])
def test_an_edited_row_group_listing_is_one_line(split_dir: Path, tmp_path: Path,
                                                 listing: str, message: str) -> None:
    edited = _copy(split_dir, tmp_path)
    manifest = json.loads((edited / "dataset_manifest.json").read_text())
    groups = manifest[ROW_GROUPS]
    manifest[ROW_GROUPS] = {"text": "many", "pairs": [[1, 2, 3]],
                            "rows": [[f, r + 1] for f, r in groups],
                            "first": [[0, groups[0][1]]] + [[f + 1, r] for f, r in groups[1:]],
                            }[listing]
    (edited / "dataset_manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(VaecfError, match=message):
        load_split(edited, train_share=(1, 2))
