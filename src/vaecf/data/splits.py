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
- ``dataset_manifest.json`` with ``n_items``, ``n_users`` per split and ``user_offset``.

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

from vaecf.errors import VaecfError
from vaecf.io.manifest import read_manifest
from vaecf.io.readers import IDS, INDEX, field, read_npz_csr, read_parquet

SPLITS = ("train", "val", "test")
HELDOUT_SPLITS = ("val", "test")
PARTS = ("fold_in", "holdout")
MANIFEST_STAGE = "dataset"
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
_ROW_GROUP = 1 << 20  # rows buffered before a streamed file writes a row group


def save_parquet(path: Path, table: pa.Table) -> None:
    """Write a Parquet file deterministically (no pandas index, fixed options)."""
    pq.write_table(table, path, **_PARQUET_OPTIONS)


def save_parquet_batches(path: Path, schema: pa.Schema,
                         batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Write ``batches`` (cast to ``schema``) as one Parquet file, as ``save_parquet`` would,
    holding at most one row group in memory; yields each batch once it is buffered, so the
    caller can consume the rows while they stream (a Spark engine's sorted output)."""
    with pq.ParquetWriter(path, schema, **_PARQUET_OPTIONS) as writer:
        buffered: list[pa.RecordBatch] = []
        rows = 0
        for batch in batches:
            batch = pa.RecordBatch.from_arrays(
                [batch.column(i).cast(f.type) for i, f in enumerate(schema)], schema=schema)
            buffered.append(batch)
            rows += batch.num_rows
            yield batch
            if rows >= _ROW_GROUP:
                writer.write_table(pa.Table.from_batches(buffered, schema))
                buffered, rows = [], 0
        if buffered:
            writer.write_table(pa.Table.from_batches(buffered, schema))


PAIRS_SCHEMA = pa.schema([("user_idx", pa.int32()), ("item_idx", pa.int32())])


def write_part(directory: Path, part: str, batches: Iterable[pa.RecordBatch],
               shape: tuple[int, int], offset: int) -> int:
    """Write ``<part>.parquet`` and ``<part>.npz`` from the part's pairs.

    Args:
      batches: columns ``user_idx`` (global) and ``item_idx``, in (user_idx, item_idx) order.
      shape: (users in the part's split, n_items); ``offset``: the split's first user_idx.

    Returns:
      The number of pairs. Only the item column is held (the CSR's indices), not the pairs.
    """
    items: list[np.ndarray] = []
    row_sizes = np.zeros(shape[0], dtype=np.int64)
    for batch in save_parquet_batches(directory / f"{part}.parquet", PAIRS_SCHEMA, batches):
        rows = batch.column(0).to_numpy() - offset
        row_sizes += np.bincount(rows, minlength=shape[0])
        items.append(batch.column(1).to_numpy())
    indices = np.concatenate(items) if items else np.zeros(0, np.int32)
    indptr = np.concatenate([[0], np.cumsum(row_sizes)])
    save_csr(directory / f"{part}.npz", sp.csr_matrix(
        (np.ones(len(indices), np.float32), indices, indptr), shape=shape))
    return len(indices)


@dataclass(frozen=True)
class Split:
    """A loaded split. Matrices are CSR, float32, shape (users in the split, n_items)."""

    directory: Path
    manifest: dict[str, Any]
    train: sp.csr_matrix
    val_fold_in: sp.csr_matrix
    val_holdout: sp.csr_matrix
    test_fold_in: sp.csr_matrix
    test_holdout: sp.csr_matrix
    item_ids: np.ndarray  # (n_items,): raw item id of each item_idx

    @property
    def n_items(self) -> int:
        return int(self.manifest["n_items"])

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


def load_split(directory: Path) -> Split:
    """Load and verify a split directory (manifest present, checksums and shapes consistent)."""
    read = [f"{name}.npz" for name in matrix_names()] + ["item_index.parquet",
                                                         "user_index.parquet"]
    manifest = read_manifest(directory, MANIFEST_STAGE, required=read)
    where = f"{directory}/dataset_manifest.json"
    n_items = field(manifest, "n_items", where, "int")
    counts = field(manifest, "n_users", where, "dict")
    n_users = {s: field(counts, s, f"{where}: n_users", "int") for s in SPLITS}
    offsets = field(manifest, "user_offset", where, "dict")
    for s in SPLITS:
        field(offsets, s, f"{where}: user_offset", "int")
    matrices: dict[str, sp.csr_matrix] = {}
    for name in matrix_names():
        path = directory / f"{name}.npz"
        matrix = read_npz_csr(path).astype(np.float32)
        expected = (n_users[name.split("_")[0]], n_items)
        if matrix.shape != expected:
            raise VaecfError(f"{path}: shape {matrix.shape} does not match the manifest's "
                             f"{expected}")
        matrices[name] = matrix
    items = read_parquet(directory / "item_index.parquet",
                         {"item_idx": INDEX, "item_id": IDS}).to_pandas()
    if len(items) != n_items or not np.array_equal(items["item_idx"].to_numpy(),
                                                    np.arange(n_items)):
        raise VaecfError(f"{directory}/item_index.parquet: does not list item_idx 0..{n_items - 1}")
    return Split(directory=directory, manifest=manifest, item_ids=items["item_id"].to_numpy(),
                 **matrices)
