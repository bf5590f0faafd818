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
"""

from __future__ import annotations

import math

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


class BatchMaker:
    """Gathers CSR rows into ``SparseBatch`` es (a TensorFlow function usable in tf.data).

    Args:
      matrix: CSR [users, items] training matrix (float32 values).
      granule: entries are padded to a multiple of this (1: no padding).
    """

    def __init__(self, matrix: sp.csr_matrix, granule: int = 1) -> None:
        indptr = tf.constant(matrix.indptr.astype(np.int64))
        self._items = tf.RaggedTensor.from_row_splits(
            tf.constant(matrix.indices.astype(np.int64)), indptr, validate=False)
        self._values = tf.RaggedTensor.from_row_splits(
            tf.constant(matrix.data.astype(np.float32)), indptr, validate=False)
        self._granule = granule

    def __call__(self, users: tf.Tensor) -> SparseBatch:
        """The rows ``users`` (int64 [b]) as a padded ``SparseBatch``."""
        items = tf.gather(self._items, users)
        values = tf.gather(self._values, users).flat_values
        rows = items.value_rowids()
        nnz = tf.shape(values, out_type=tf.int64)[0]
        pad = (-nnz) % self._granule
        return SparseBatch(rows=tf.pad(rows, [[0, pad]]),
                           item_idx=tf.pad(items.flat_values, [[0, pad]]),
                           values=tf.pad(values, [[0, pad]]),
                           user_idx=users)


def dataset(maker: BatchMaker, users: np.ndarray) -> tf.data.Dataset:
    """A prefetching dataset of the batches whose rows are ``users`` [steps, b]."""
    data = tf.data.Dataset.from_tensor_slices(users)
    data = data.map(maker, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return data.prefetch(tf.data.AUTOTUNE)


def csr_batch(rows: sp.csr_matrix) -> SparseBatch:
    """A CSR chunk (e.g. validation fold-in rows) as an unpadded ``SparseBatch``."""
    counts = np.diff(rows.indptr)
    return SparseBatch(
        rows=tf.constant(np.repeat(np.arange(rows.shape[0], dtype=np.int64), counts)),
        item_idx=tf.constant(rows.indices.astype(np.int64)),
        values=tf.constant(rows.data.astype(np.float32)),
        user_idx=tf.range(rows.shape[0], dtype=tf.int64))
