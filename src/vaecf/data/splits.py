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

That is the layout of every local output and of the pandas engine's. The Spark engine's
``s3://`` output has no NPZ and no file assembled by its driver: each table is the Parquet
parts its tasks wrote, ``<table>/part-<n>.parquet``, sorted as the file would be, which the
manifest's ``parts`` lists with each part's rows, first key and row groups
(``vaecf.data.split_files``). ``load_split`` reads both layouts into the same ``Split``.

NPZ and Parquet files are written byte-deterministically (fixed zip timestamps), so the same
data and seed give byte-identical files.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import zipfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp

from vaecf import log
from vaecf.data.split_files import PART_FILES as PART_FILES
from vaecf.data.split_files import ROW_GROUPS as ROW_GROUPS
from vaecf.data.split_files import listed, read_index, read_pairs, row_groups
from vaecf.errors import VaecfError
from vaecf.io.manifest import read_manifest, require_listed
from vaecf.io.publish import open_input
from vaecf.io.readers import IDS, INDEX, field, read_npz_csr

SPLITS = ("train", "val", "test")
HELDOUT_SPLITS = ("val", "test")
PARTS = ("fold_in", "holdout")
MANIFEST_STAGE = "dataset"
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
STREAM_GROUP_ROWS = 1 << 20  # rows of a streamed file's row groups unless a part asks
# for others


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
                         group_rows: int = STREAM_GROUP_ROWS) -> Iterator[pa.RecordBatch]:
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
               group_rows: int = STREAM_GROUP_ROWS) -> tuple[int, list[list[int]]]:
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

    def user_index(self) -> pa.Table:
        """``user_idx`` and ``user_id`` of every user (``user_index.parquet`` or its parts),
        read when asked: a top-k export maps its users' indices back to raw ids with it."""
        n_users = sum(int(n) for n in self.manifest["n_users"].values())
        return read_index(self.directory, self.manifest, "user_index",
                          {"user_idx": INDEX, "user_id": IDS}, n_users)

    def write_item_index(self, path: Path) -> None:
        """The split's ``item_index.parquet`` at ``path`` (a trained model's copy, which
        ``vaecf recommend`` reads): the file itself, or one file of its parts' rows."""
        if PART_FILES not in self.manifest:
            shutil.copyfile(listed(self.directory, self.manifest, "item_index.parquet"), path)
            return
        save_parquet(path, read_index(self.directory, self.manifest, "item_index",
                                      {"item_idx": INDEX, "item_id": IDS}, self.n_items))


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
    """Load and verify a split directory (manifest present, checksums and shapes consistent),
    in either layout (``vaecf.data.split_files``): a file per table, or the Parquet parts a
    cluster's tasks wrote (the manifest's ``parts``; no NPZ), read alike.

    Args:
      train_share: ``(share, shares)``: load the rows of ``user_share(n, shares, share)``
        alone (a Horovod rank's), read from the row groups that hold them (of
        ``train.parquet`` or of its parts; a split made before its manifest listed
        ``train_row_groups`` is read whole from ``train.npz``, then sliced). None: every
        training user.
    """
    manifest = read_manifest(directory, MANIFEST_STAGE,
                             select=lambda listing: files_read(listing, train_share))
    where = f"{directory}/dataset_manifest.json"
    parts = PART_FILES in manifest
    if not parts:
        require_listed(manifest, MANIFEST_STAGE, directory,
                       _FILES + ([] if train_share else ["train.npz"]))
    n_items = field(manifest, "n_items", where, "int")
    counts = field(manifest, "n_users", where, "dict")
    n_users = {s: field(counts, s, f"{where}: n_users", "int") for s in SPLITS}
    offsets = field(manifest, "user_offset", where, "dict")
    for s in SPLITS:
        field(offsets, s, f"{where}: user_offset", "int")
    pairs = field(field(manifest, "counts", where, "dict"), "pairs", f"{where}: counts", "dict")
    field(pairs, "train", f"{where}: counts: pairs", "int")  # Split.n_train_pairs
    train_users = range(n_users["train"])
    if train_share is not None:
        train_users = user_share(n_users["train"], train_share[1], train_share[0])
    matrices: dict[str, sp.csr_matrix] = {}
    rows_read: dict[str, int] = {}  # pairs read from disk, per matrix
    for name in matrix_names():
        split = name.split("_")[0]
        span = range(offsets[split], offsets[split] + n_users[split])
        share = name == "train" and train_share is not None
        groups = (row_groups(directory, manifest, name,
                             field(pairs, name, f"{where}: counts: pairs", "int"))
                  if parts or share else None)
        if groups is not None:
            users = train_users if share else span
            matrices[name], rows_read[name] = read_pairs(groups, users, span, n_items)
        else:
            if share:
                log.info(f"{directory}: made before training read only each rank's share (no "
                         f"{ROW_GROUPS} in its manifest): reading train.npz whole; remake it "
                         "with 'vaecf split' to read only the share")
                listed(directory, manifest, "train.npz")
            matrix = _matrix(directory, name, (len(span), n_items))
            rows_read[name] = matrix.nnz
            matrices[name] = matrix[train_users.start:train_users.stop] if share else matrix
    items = read_index(directory, manifest, "item_index", {"item_idx": INDEX, "item_id": IDS},
                       n_items).to_pandas()
    if len(items) != n_items or not np.array_equal(items["item_idx"].to_numpy(),
                                                    np.arange(n_items)):
        raise VaecfError(f"{directory}/item_index.parquet: does not list item_idx 0..{n_items - 1}")
    return Split(directory=directory, manifest=manifest, item_ids=items["item_id"].to_numpy(),
                 train_first=train_users.start, train_rows_read=rows_read["train"], **matrices)


_FILES = [f"{name}.npz" for name in matrix_names()[1:]] + ["item_index.parquet",
                                                           "user_index.parquet"]


def files_read(manifest: dict[str, Any], train_share: tuple[int, int] | None) -> list[str]:
    """The listed files ``load_split(directory, train_share)`` reads, the only ones it
    verifies and, from ``s3://``, the only ones ``open_split`` fetches: every file but the
    training pairs it does not read (the parts that do not hold the share; ``train.npz`` where
    ``train.parquet``'s row groups give the share, else ``train.parquet``)."""
    where = "dataset_manifest.json"
    files = list(field(manifest, "files", where, "dict"))
    if PART_FILES not in manifest and not (train_share and ROW_GROUPS in manifest):
        return [name for name in files if name != "train.parquet"]
    if PART_FILES not in manifest:
        return [name for name in files if name != "train.npz"]
    if train_share is None:
        return files
    rows = field(field(field(manifest, "counts", where, "dict"), "pairs", f"{where}: counts",
                       "dict"), "train", f"{where}: counts: pairs", "int")
    groups = row_groups(Path(), manifest, "train", rows)
    assert groups is not None  # the parts layout lists the training parts
    users = user_share(field(field(manifest, "n_users", where, "dict"), "train",
                             f"{where}: n_users", "int"), train_share[1], train_share[0])
    every = {path.as_posix() for path in groups.paths}
    held = {groups.paths[f].as_posix() for f in groups.file[groups.holding(users)]}
    return [name for name in files if name not in every or name in held]


@contextmanager
def open_split(uri: str, train_share: tuple[int, int] | None = None) -> Iterator[Split]:
    """``load_split`` of the split at ``uri``: a folder read in place, or an ``s3://`` output
    of which only ``files_read`` is fetched into a private temporary folder (a training rank
    downloads its share of the training pairs, not the split), removed on exit."""
    with open_input(uri, MANIFEST_STAGE, lambda listing: files_read(listing, train_share)
                    ) as directory:
        yield load_split(directory, train_share)


def _matrix(directory: Path, name: str, shape: tuple[int, int]) -> sp.csr_matrix:
    path = directory / f"{name}.npz"
    matrix = read_npz_csr(path).astype(np.float32)
    if matrix.shape != shape:
        raise VaecfError(f"{path}: shape {matrix.shape} does not match the manifest's {shape}")
    return matrix
