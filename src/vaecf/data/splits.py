"""The split on disk: the contract between ``vaecf split`` and training and evaluation.

A split directory holds, per DESIGN.md section 3:

- ``train.npz``, ``val_fold_in.npz``, ``val_holdout.npz``, ``test_fold_in.npz``,
  ``test_holdout.npz``: scipy CSR matrices of shape (users in that split, n_items), float32
  ones. Row r of ``val_fold_in`` and row r of ``val_holdout`` are the same user.
- the same pairs as Parquet (``train.parquet``, ``val_fold_in.parquet``, ...), columns
  ``user_idx`` (global, int32) and ``item_idx`` (int32).
- ``user_index.parquet`` (``user_idx``, ``user_id``, ``split``) and ``item_index.parquet``
  (``item_idx``, ``item_id``). ``user_idx`` is contiguous: train users first, then val,
  then test, so row r of a split's matrices is user ``user_offset[split] + r``.
- ``dataset_manifest.json`` with ``n_items``, ``n_users`` per split and ``user_offset``,
  and ``train_row_groups``: ``[first user_idx, rows]`` of each row group of ``train.parquet``
  (sorted by user_idx, item_idx; groups of at most ``ROW_GROUP_ROWS`` rows), so that a
  Horovod rank reads only the groups that hold its share of the training users
  (``load_split(directory, train_share=...)``), never the whole training matrix.

NPZ and Parquet files are written byte-deterministically (fixed zip timestamps), so the same
data and seed give byte-identical files.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp

from vaecf import log
from vaecf.errors import VaecfError
from vaecf.io.bounds import COUNT  # user_idx and row counts: scipy's CSR, Parquet's row groups
from vaecf.io.manifest import read_manifest
from vaecf.io.readers import IDS, INDEX, field, read_npz_csr, read_parquet

SPLITS = ("train", "val", "test")
HELDOUT_SPLITS = ("val", "test")
PARTS = ("fold_in", "holdout")
MANIFEST_STAGE = "dataset"
ROW_GROUPS = "train_row_groups"
ROW_GROUP_ROWS = 1 << 16  # 512 KiB of (user_idx, item_idx) int32 pairs before compression
MIN_GROUP_ROWS = 1024
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def matrix_names() -> list[str]:
    """``train`` and ``{val,test}_{fold_in,holdout}``: the names of the split's matrices."""
    return ["train"] + [f"{s}_{p}" for s in HELDOUT_SPLITS for p in PARTS]


def save_csr(path: Path, matrix: sp.csr_matrix) -> None:
    """Write ``matrix`` in scipy's ``.npz`` layout with fixed timestamps (byte-deterministic).

    ``scipy.sparse.load_npz`` reads the result.
    """
    matrix = sp.csr_matrix(matrix)
    matrix.sort_indices()
    arrays = {
        "indices": matrix.indices,
        "indptr": matrix.indptr,
        "format": np.array(b"csr"),
        "shape": np.array(matrix.shape),
        "data": matrix.data,
    }
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for key, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.asarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=_ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, buffer.getvalue())


_PARQUET_OPTIONS: dict[str, Any] = {"compression": "zstd", "use_dictionary": True,
                                    "write_statistics": True, "store_schema": True}
_ROW_GROUP = 1 << 20  # rows of a streamed file's row groups unless a part asks for others


def save_parquet(path: Path, table: pa.Table) -> None:
    """Write a Parquet file deterministically (no pandas index, fixed options)."""
    pq.write_table(table, path, **_PARQUET_OPTIONS)


def row_group_rows(n_rows: int) -> int:
    """Rows per group of ``train.parquet``: at most ``ROW_GROUP_ROWS`` (a rank reads at most
    two groups' rows beyond its share: 1 MiB of pairs), and at least 256 groups down to
    ``MIN_GROUP_ROWS`` rows, so that the ranks of a small split also read little more than
    their share."""
    return min(ROW_GROUP_ROWS, max(MIN_GROUP_ROWS, -(-n_rows // 256)))


def save_parquet_batches(path: Path, schema: pa.Schema, batches: Iterable[pa.RecordBatch],
                         group_rows: int = _ROW_GROUP) -> Iterator[pa.RecordBatch]:
    """Write ``batches`` (cast to ``schema``) as one Parquet file, as ``save_parquet`` would,
    in row groups of exactly ``group_rows`` rows (the last one shorter), holding at most one
    row group in memory; yields each batch once it is buffered, so the caller can consume the
    rows while they stream (a Spark engine's sorted output)."""
    with pq.ParquetWriter(path, schema, **_PARQUET_OPTIONS) as writer:
        buffered: list[pa.RecordBatch] = []
        rows = 0
        for batch in batches:
            batch = pa.RecordBatch.from_arrays(
                [batch.column(i).cast(f.type) for i, f in enumerate(schema)], schema=schema)
            buffered.append(batch)
            rows += batch.num_rows
            yield batch
            while rows >= group_rows:
                table = pa.Table.from_batches(buffered, schema)
                writer.write_table(table.slice(0, group_rows), row_group_size=group_rows)
                buffered = table.slice(group_rows).combine_chunks().to_batches()
                rows -= group_rows
        if rows:
            writer.write_table(pa.Table.from_batches(buffered, schema), row_group_size=rows)


PAIRS_SCHEMA = pa.schema([("user_idx", pa.int32()), ("item_idx", pa.int32())])
_COUNT_ROWS = 1 << 22


def write_part(directory: Path, part: str, batches: Iterable[pa.RecordBatch],
               shape: tuple[int, int], offset: int,
               group_rows: int = _ROW_GROUP) -> tuple[int, list[list[int]]]:
    """Write ``<part>.parquet`` and ``<part>.npz`` from the part's pairs.

    Args:
      batches: columns ``user_idx`` (global) and ``item_idx``, in (user_idx, item_idx) order.
      shape: (users in the part's split, n_items); ``offset``: the split's first user_idx.
      group_rows: rows per row group of the Parquet file (``row_group_rows`` for training).

    Returns:
      The number of pairs, and ``[first user_idx, rows]`` of each row group (the manifest's
      ``train_row_groups``). Only the item column is held (the CSR's indices), not the pairs.
    """
    items: list[np.ndarray] = []
    row_sizes = np.zeros(shape[0], dtype=np.int64)
    path = directory / f"{part}.parquet"
    for batch in save_parquet_batches(path, PAIRS_SCHEMA, batches, group_rows):
        users = batch.column(0).to_numpy()
        for start in range(0, len(users), _COUNT_ROWS):  # bincount's intp copy, a slice at a time
            row_sizes += np.bincount(users[start:start + _COUNT_ROWS] - offset,
                                     minlength=shape[0])
        items.append(batch.column(1).to_numpy())
    indices = (items[0] if len(items) == 1 else np.concatenate(items) if items
               else np.zeros(0, np.int32))
    indptr = np.concatenate([[0], np.cumsum(row_sizes)])
    save_csr(directory / f"{part}.npz", sp.csr_matrix(
        (np.ones(len(indices), np.float32), indices, indptr), shape=shape))
    starts = np.arange(0, len(indices), group_rows)
    first_users = offset + np.searchsorted(indptr, starts, side="right") - 1
    groups = [[int(user), int(min(group_rows, len(indices) - start))]
              for user, start in zip(first_users, starts, strict=True)]
    return len(indices), groups


@dataclass(frozen=True)
class Split:
    """A loaded split. Matrices are CSR, float32, shape (users in the split, n_items);
    ``train`` holds the training users loaded (all of them, or a rank's share): row r is
    training user ``train_first + r``."""

    directory: Path
    manifest: dict[str, Any]
    train: sp.csr_matrix
    val_fold_in: sp.csr_matrix
    val_holdout: sp.csr_matrix
    test_fold_in: sp.csr_matrix
    test_holdout: sp.csr_matrix
    item_ids: np.ndarray  # (n_items,): raw item id of each item_idx
    train_first: int = 0
    train_rows_read: int = 0  # training pairs read from disk to load ``train``

    @property
    def n_train_pairs(self) -> int:
        """Every training user's pairs, loaded or not."""
        return int(self.manifest["counts"]["pairs"]["train"])

    @property
    def n_items(self) -> int:
        return int(self.manifest["n_items"])

    @property
    def n_train_users(self) -> int:
        """Every training user, loaded or not."""
        return int(self.manifest["n_users"]["train"])

    @property
    def digest(self) -> str:
        """The split's identity (``split_digest``), recorded by ``vaecf train``."""
        return split_digest(self.manifest)

    def heldout(self, subset: str) -> tuple[sp.csr_matrix, sp.csr_matrix]:
        """``(fold_in, holdout)`` of ``subset`` (``val`` or ``test``)."""
        if subset not in HELDOUT_SPLITS:
            raise VaecfError(f"unknown subset '{subset}' (one of: {', '.join(HELDOUT_SPLITS)})")
        fold_in: sp.csr_matrix = getattr(self, f"{subset}_fold_in")
        holdout: sp.csr_matrix = getattr(self, f"{subset}_holdout")
        return fold_in, holdout


def split_digest(manifest: dict[str, Any]) -> str:
    """SHA-256 of the split's file table (each file's name and SHA-256), hex.

    It names the data, not the run that wrote it: a rerun with the same seed or a copy in
    object storage has the same digest, another seed or another dataset a different one (the
    manifest's own bytes would also change with its wall time and paths).
    """
    table = {name: entry["sha256"] for name, entry in manifest["files"].items()}
    return hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest()


def user_share(n_users: int, shares: int, share: int) -> range:
    """The training users of share ``share`` of ``shares`` (Horovod rank ``share`` trains
    them): a contiguous range, ``[share * n / shares, (share + 1) * n / shares)``."""
    return range(share * n_users // shares, (share + 1) * n_users // shares)


def load_split(directory: Path, train_share: tuple[int, int] | None = None) -> Split:
    """Load and verify a split directory (manifest present, checksums and shapes consistent).

    Args:
      train_share: ``(share, shares)``: load the rows of ``user_share(n, shares, share)``
        alone (a Horovod rank's), read from the row groups of ``train.parquet`` that hold
        them (a split made before its manifest listed ``train_row_groups`` is read whole
        from ``train.npz``, then sliced). None: every training user, from ``train.npz``.
    """
    read = [f"{name}.npz" for name in matrix_names()[1:]] + ["item_index.parquet",
                                                             "user_index.parquet"]
    if train_share is None:
        read.append("train.npz")
    manifest = read_manifest(directory, MANIFEST_STAGE, required=read)
    where = f"{directory}/dataset_manifest.json"
    n_items = field(manifest, "n_items", where, "int")
    counts = field(manifest, "n_users", where, "dict")
    n_users = {s: field(counts, s, f"{where}: n_users", "int") for s in SPLITS}
    offsets = field(manifest, "user_offset", where, "dict")
    for s in SPLITS:
        field(offsets, s, f"{where}: user_offset", "int")
    matrices = {name: _matrix(directory, name, (n_users[name.split("_")[0]], n_items))
                for name in matrix_names()[1:]}
    pairs = field(field(manifest, "counts", where, "dict"), "pairs", f"{where}: counts", "dict")
    field(pairs, "train", f"{where}: counts: pairs", "int")
    train_users = range(n_users["train"])
    if train_share is None:
        matrices["train"] = _matrix(directory, "train", (n_users["train"], n_items))
        read_rows = matrices["train"].nnz
    else:
        train_users = user_share(n_users["train"], train_share[1], train_share[0])
        matrices["train"], read_rows = _train_rows(directory, manifest, train_users, n_items)
    items = read_parquet(directory / "item_index.parquet",
                         {"item_idx": INDEX, "item_id": IDS}).to_pandas()
    if len(items) != n_items or not np.array_equal(items["item_idx"].to_numpy(),
                                                    np.arange(n_items)):
        raise VaecfError(f"{directory}/item_index.parquet: does not list item_idx 0..{n_items - 1}")
    return Split(directory=directory, manifest=manifest, item_ids=items["item_id"].to_numpy(),
                 train_first=train_users.start, train_rows_read=read_rows, **matrices)


def _matrix(directory: Path, name: str, shape: tuple[int, int]) -> sp.csr_matrix:
    path = directory / f"{name}.npz"
    matrix = read_npz_csr(path).astype(np.float32)
    if matrix.shape != shape:
        raise VaecfError(f"{path}: shape {matrix.shape} does not match the manifest's {shape}")
    return matrix


def _train_rows(directory: Path, manifest: dict[str, Any], users: range,
                n_items: int) -> tuple[sp.csr_matrix, int]:
    """CSR [len(users), n_items]: the training rows of ``users`` alone, from the row groups
    of ``train.parquet`` that hold them (the manifest lists each group's first user), and
    the pairs read to find them."""
    if ROW_GROUPS not in manifest:
        log.info(f"{directory}: made before training read only each rank's share (no "
                 f"{ROW_GROUPS} in its manifest): reading train.npz whole; remake it with "
                 "'vaecf split' to read only the share")
        _listed(directory, manifest, "train.npz")
        matrix = _matrix(directory, "train", (int(manifest["n_users"]["train"]), n_items))
        return matrix[users.start:users.stop], matrix.nnz
    path = _listed(directory, manifest, "train.parquet")
    firsts, rows = _row_groups(manifest, f"{directory}/dataset_manifest.json")
    after = np.append(firsts[1:], np.iinfo(np.int64).max)  # a user may straddle two groups
    chosen = np.flatnonzero((firsts < users.stop) & (after >= users.start))
    table = read_parquet(path, {"user_idx": INDEX, "item_idx": INDEX},
                         row_groups=chosen.tolist(), group_rows=rows.tolist())
    user = table.column("user_idx").to_numpy().astype(np.int64)
    item = table.column("item_idx").to_numpy().astype(np.int64)
    starts = np.cumsum(rows[chosen]) - rows[chosen]  # each chosen group's first row
    if (user[starts] != firsts[chosen]).any() or (np.diff(user) < 0).any():
        raise VaecfError(f"{path}: its rows are not sorted by user_idx from the first users "
                         f"the manifest lists for its row groups")
    if len(item) and not 0 <= item.min() <= item.max() < n_items:
        raise VaecfError(f"{path}: item_idx outside 0..{n_items - 1}")
    keep = (user >= users.start) & (user < users.stop)
    matrix = sp.csr_matrix((np.ones(int(keep.sum()), np.float32),
                            (user[keep] - users.start, item[keep])),
                           shape=(len(users), n_items))
    matrix.sum_duplicates()
    return matrix, len(user)


def _listed(directory: Path, manifest: dict[str, Any], name: str) -> Path:
    """``directory / name``, which the manifest lists (and ``read_manifest`` verified)."""
    if name not in manifest["files"]:
        raise VaecfError(f"{directory / name}: not listed in {MANIFEST_STAGE}_manifest.json "
                         "(is it the output of 'vaecf split'?)")
    return directory / name


def _row_groups(manifest: dict[str, Any], where: str) -> tuple[np.ndarray, np.ndarray]:
    """(first user, rows) of each row group of ``train.parquet``, int64 [groups] each."""
    groups = field(manifest, ROW_GROUPS, where, "list")
    if not all(isinstance(g, list) and len(g) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= COUNT for v in g)
            for g in groups):  # an edited 2**64 would overflow int64 below
        raise VaecfError(f"{where}: '{ROW_GROUPS}': expected [first user_idx, rows] pairs "
                         f"of integers from 0 to {COUNT}")
    pairs = np.array(groups, dtype=np.int64).reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1]
