"""Input pipeline: users' CSR rows -> sparse batches, prepared by tf.data ahead of compute.

The training matrix stays in CSR form (as a RaggedTensor over ``indices``/``indptr``); a
batch is a gather of rows, never a dense users x items array. Batches are built by tf.data
(in its own threads, without the Python GIL) and prefetched, so batch preparation overlaps
the previous step.

Sharding: each epoch draws one permutation of the training users from ``(seed, epoch)``;
global batch ``k`` is positions ``k*B .. (k+1)*B`` of that permutation (wrapping around so
that every step is full), and rank ``r`` of ``W`` takes the ``r``-th contiguous slice of
``B/W`` users. The union of the ranks' batches is therefore exactly the global batch one
process would see, for any world size.

The entries of a batch are padded to a multiple of a fixed granule (value 0 entries), so a
compiled step (``--xla``) sees a handful of shapes instead of one per batch.

Placement (decided here alone, STYLE.md 13): on a GPU host the CSR arrays live on the GPU
(ML-20M's are ~40 MB) with the epoch's permutation, and each batch is gathered there by ops
that have GPU kernels, so nothing crosses from the host per step (the host tf.data pipeline
was 18-22% of an H100 epoch under --xla, DESIGN.md section 8). On a CPU host batches are
built by tf.data in its own threads, ahead of compute, which is what is fastest there.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import scipy.sparse as sp
import tensorflow as tf

from vaecf.model import SparseBatch


def steps_per_epoch(n_users: int, batch_size: int, requested: int | None) -> int:
    """One pass over the users (the last batch wraps around), unless a count is requested."""
    return requested if requested is not None else max(1, math.ceil(n_users / batch_size))


def epoch_users(n_users: int, *, seed: int, epoch: int, steps: int, batch_size: int,
                world_size: int, rank: int) -> np.ndarray:
    """Training rows of this rank's batches in ``epoch`` (1-based): int64 [steps, B / W].

    Args:
      n_users: rows of the training matrix.
      batch_size: the global batch B (divisible by ``world_size``).
    """
    order = np.random.default_rng([seed, epoch]).permutation(n_users)
    positions = np.resize(order, steps * batch_size)  # cyclic: the last batch wraps around
    local = batch_size // world_size
    return positions.reshape(steps, world_size, local)[:, rank, :].astype(np.int64)


def pad_granule(matrix: sp.csr_matrix, local_batch: int) -> int:
    """A power of two near 1/32 of a batch's expected entries (padding costs <= ~3%)."""
    mean_nnz = matrix.nnz / max(matrix.shape[0], 1) * local_batch
    return 1 << max(4, int(math.log2(max(mean_nnz, 1.0) / 32)))


def resident_device() -> str | None:
    """Where the training matrix should live: the (first visible) GPU, else None (host)."""
    gpus = tf.config.list_logical_devices("GPU")
    return gpus[0].name if gpus else None


class BatchMaker:
    """Gathers CSR rows into ``SparseBatch`` es, on the host (tf.data) or on ``device``.

    Args:
      matrix: CSR [users, items] training matrix (float32 values).
      granule: entries are padded to a multiple of this (1: no padding).
      device: keep the matrix on this device and gather batches there (``resident_device``).
    """

    def __init__(self, matrix: sp.csr_matrix, granule: int = 1,
                 device: str | None = None) -> None:
        self.device, self._granule = device, granule
        with tf.device(device or "/CPU:0"):
            self._indptr = tf.constant(matrix.indptr.astype(np.int64))
            self._indices = tf.constant(matrix.indices.astype(np.int64))
            self._data = tf.constant(matrix.data.astype(np.float32))
        self._items = tf.RaggedTensor.from_row_splits(self._indices, self._indptr,
                                                      validate=False)
        self._values = tf.RaggedTensor.from_row_splits(self._data, self._indptr, validate=False)
        self.resident_gather = tf.function(self._resident, reduce_retracing=True)

    def __call__(self, users: tf.Tensor) -> SparseBatch:
        """The rows ``users`` (int64 [b]) as a padded ``SparseBatch`` (ragged ops: host)."""
        items = tf.gather(self._items, users)
        values = tf.gather(self._values, users).flat_values
        return self._padded(items.value_rowids(), items.flat_values, values, users)

    def _resident(self, users: tf.Tensor) -> SparseBatch:
        """``__call__`` from ops with GPU kernels (RaggedGather has only a CPU kernel)."""
        starts = tf.gather(self._indptr, users)
        splits = tf.concat([tf.zeros([1], tf.int64),
                            tf.cumsum(tf.gather(self._indptr, users + 1) - starts)], 0)
        entry = tf.range(splits[-1])
        rows = tf.searchsorted(splits, entry, side="right", out_type=tf.int64) - 1
        position = tf.gather(starts, rows) + entry - tf.gather(splits, rows)
        return self._padded(rows, tf.gather(self._indices, position),
                            tf.gather(self._data, position), users)

    def _padded(self, rows: tf.Tensor, items: tf.Tensor, values: tf.Tensor,
                users: tf.Tensor) -> SparseBatch:
        pad = (-tf.shape(values, out_type=tf.int64)[0]) % self._granule
        return SparseBatch(rows=tf.pad(rows, [[0, pad]]), item_idx=tf.pad(items, [[0, pad]]),
                           values=tf.pad(values, [[0, pad]]), user_idx=users)


def dataset(maker: BatchMaker, users: np.ndarray) -> tf.data.Dataset:
    """A prefetching host dataset of the batches whose rows are ``users`` [steps, b]."""
    data = tf.data.Dataset.from_tensor_slices(users)
    data = data.map(maker, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return data.prefetch(tf.data.AUTOTUNE)


def batches(maker: BatchMaker, users: np.ndarray) -> Iterator[SparseBatch]:
    """The batches whose rows are ``users`` [steps, b]: gathered on the maker's device when
    it has one (the epoch's permutation is copied there once), else by the host dataset
    (built and started here, before the first batch is asked for)."""
    if maker.device is None:
        return iter(dataset(maker, users))
    with tf.device(maker.device):
        resident_users = tf.constant(users)
    return _resident_batches(maker, resident_users)


def _resident_batches(maker: BatchMaker, users: tf.Tensor) -> Iterator[SparseBatch]:
    for step in range(users.shape[0]):
        with tf.device(maker.device):  # the scope ends before the yield: it must not hold
            batch = maker.resident_gather(users[step])  # over the caller's ops between steps
        yield batch


def csr_batch(rows: sp.csr_matrix) -> SparseBatch:
    """A CSR chunk (e.g. validation fold-in rows) as an unpadded ``SparseBatch``."""
    counts = np.diff(rows.indptr)
    return SparseBatch(
        rows=tf.constant(np.repeat(np.arange(rows.shape[0], dtype=np.int64), counts)),
        item_idx=tf.constant(rows.indices.astype(np.int64)),
        values=tf.constant(rows.data.astype(np.float32)),
        user_idx=tf.range(rows.shape[0], dtype=tf.int64))
