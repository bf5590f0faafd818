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

The entries of a batch are padded (value 0 entries) to a size the host chooses: a multiple of
a fixed granule, or under ``--xla`` and ``--shard-items`` one size per epoch, so the compiled
step sees a shape or two per run instead of one per batch (and sharded ranks, whose step
holds collectives, step on the same shape).

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
    return all_ranks_users(n_users, seed=seed, epoch=epoch, steps=steps,
                           batch_size=batch_size, world_size=world_size)[:, rank, :]


def all_ranks_users(n_users: int, *, seed: int, epoch: int, steps: int, batch_size: int,
                    world_size: int, pass_index: int = 0) -> np.ndarray:
    """Every rank's ``epoch_users``: int64 [steps, W, B / W] (each rank can compute all).

    ``pass_index``: the pass within the epoch (``--alternate`` makes several), each its own
    permutation; pass 0 is the epoch's one permutation of a joint epoch.
    """
    key = [seed, epoch] if pass_index == 0 else [seed, epoch, pass_index]
    order = np.random.default_rng(key).permutation(n_users)
    positions = np.resize(order, steps * batch_size)  # cyclic: the last batch wraps around
    return positions.reshape(steps, world_size, batch_size // world_size).astype(np.int64)


def pad_granule(matrix: sp.csr_matrix, local_batch: int) -> int:
    """A power of two near 1/32 of a batch's expected entries (padding costs <= ~3%)."""
    mean_nnz = matrix.nnz / max(matrix.shape[0], 1) * local_batch
    return 1 << max(4, int(math.log2(max(mean_nnz, 1.0) / 32)))


def bucket(nnz: int, granule: int) -> int:
    """``nnz`` rounded up to granule x {4, 5, 6, 7} x 2^k: at most 4 sizes per doubling, so a
    compiled step sees few shapes, and at most 25% padding."""
    units = max(1, -(-nnz // granule))
    step = 1 << max(0, units.bit_length() - 3)
    return -(-units // step) * step * granule


def resident_device() -> str | None:
    """Where the training matrix should live: the (first visible) GPU, else None (host)."""
    gpus = tf.config.list_logical_devices("GPU")
    return gpus[0].name if gpus else None


class BatchMaker:
    """Gathers CSR rows into ``SparseBatch`` es, on the host (tf.data) or on ``device``.

    Each batch's entries are padded to a size the host chooses (``padded_sizes``) from the
    row lengths it keeps, so no op waits on the device to learn a shape, and padding is
    built by ops with GPU kernels (an int64 ``tf.pad`` has none: it sent every resident
    batch device -> host -> device). Padding entries have value 0 and the batch's last row.

    Args:
      matrix: CSR [users, items] training matrix (float32 values).
      granule: entries are padded to a multiple of this (1: no padding).
      device: keep the matrix on this device and gather batches there (``resident_device``).
      one_size: pad every batch of an epoch to one size, a ``bucket`` of the largest batch
        of any rank (``--xla`` compiles the step once per shape: per batch, 12-15 compiles
        at batch 500 on ML-20M-shaped data, each at different steps on different ranks;
        ``--shard-items`` ranks must run the same collectives on the same shapes).
    """

    def __init__(self, matrix: sp.csr_matrix, granule: int = 1,
                 device: str | None = None, one_size: bool = False) -> None:
        self.device, self._granule, self._one_size = device, granule, one_size
        self._lengths = np.diff(matrix.indptr).astype(np.int64)
        with tf.device(device or "/CPU:0"):
            self._indptr = tf.constant(matrix.indptr.astype(np.int64))
            self._indices = tf.constant(matrix.indices.astype(np.int64))
            self._data = tf.constant(matrix.data.astype(np.float32))
        self._items = tf.RaggedTensor.from_row_splits(self._indices, self._indptr,
                                                      validate=False)
        self._values = tf.RaggedTensor.from_row_splits(self._data, self._indptr, validate=False)
        self.resident_gather = tf.function(self._resident, reduce_retracing=True)

    def padded_sizes(self, users: np.ndarray, rank: int = 0) -> np.ndarray:
        """Entries of each of ``rank``'s batches after padding: int64 [steps].

        Args:
          users: every rank's rows, int64 [steps, W, b] (``all_ranks_users``).
        """
        nnz = self._lengths[users].sum(axis=2)  # [steps, W]
        if self._one_size:  # the same on every rank: computed from every rank's batches
            return np.full(len(users), bucket(int(nnz.max(initial=0)), self._granule))
        return -(-nnz[:, rank] // self._granule) * self._granule

    def __call__(self, users: tf.Tensor, padded: tf.Tensor) -> SparseBatch:
        """The rows ``users`` (int64 [b]) padded to ``padded`` entries (ragged ops: host)."""
        items = tf.gather(self._items, users)
        values = tf.gather(self._values, users).flat_values
        pad = padded - tf.shape(values, out_type=tf.int64)[0]
        last = tf.shape(users, out_type=tf.int64)[0] - 1
        return SparseBatch(rows=tf.concat([items.value_rowids(), tf.fill([pad], last)], 0),
                           item_idx=tf.concat([items.flat_values, tf.zeros([pad], tf.int64)], 0),
                           values=tf.concat([values, tf.zeros([pad])], 0), user_idx=users)

    def _resident(self, users: tf.Tensor, padded: tf.Tensor) -> SparseBatch:
        """``__call__`` from ops with GPU kernels (RaggedGather has only a CPU kernel).

        ``padded`` is a host scalar, so ``tf.range`` (whose GPU kernel reads its limit from
        host memory) does not wait for the device's cumsum.
        """
        starts = tf.gather(self._indptr, users)
        splits = tf.concat([tf.zeros([1], tf.int64),
                            tf.cumsum(tf.gather(self._indptr, users + 1) - starts)], 0)
        entry = tf.range(padded, dtype=tf.int64)  # int64 start and delta: no Cast on device
        real = entry < splits[-1]
        last = tf.shape(users, out_type=tf.int64)[0] - 1
        rows = tf.minimum(tf.searchsorted(splits, entry, side="right", out_type=tf.int64) - 1,
                          last)  # padding: the last row
        position = tf.where(real, tf.gather(starts, rows) + entry - tf.gather(splits, rows), 0)
        items = tf.where(real, tf.gather(self._indices, position), 0)
        values = tf.where(real, tf.gather(self._data, position), 0.0)
        return SparseBatch(rows=rows, item_idx=items, values=values, user_idx=users)


def dataset(maker: BatchMaker, users: np.ndarray, padded: np.ndarray) -> tf.data.Dataset:
    """A prefetching host dataset of the batches whose rows are ``users`` [steps, b]."""
    data = tf.data.Dataset.from_tensor_slices((users, padded))
    data = data.map(maker, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return data.prefetch(tf.data.AUTOTUNE)


def batches(maker: BatchMaker, users: np.ndarray,
            padded: np.ndarray | None = None) -> Iterator[SparseBatch]:
    """The batches whose rows are ``users`` [steps, b], of ``padded`` [steps] entries
    (default: ``maker.padded_sizes`` of these users alone): gathered on the maker's device
    when it has one (the epoch's permutation is copied there once), else by the host dataset
    (built and started here, before the first batch is asked for)."""
    if padded is None:
        padded = maker.padded_sizes(users[:, np.newaxis, :])
    if maker.device is None:
        return iter(dataset(maker, users, padded))
    with tf.device(maker.device):
        resident_users = tf.constant(users)
    return _resident_batches(maker, resident_users, padded)


def _resident_batches(maker: BatchMaker, users: tf.Tensor,
                      padded: np.ndarray) -> Iterator[SparseBatch]:
    for step in range(users.shape[0]):
        with tf.device("/CPU:0"):
            size = tf.constant(padded[step], tf.int64)  # a host scalar: no device round trip
        with tf.device(maker.device):  # the scope ends before the yield: it must not hold
            batch = maker.resident_gather(users[step], size)  # over the caller's ops
        yield batch


def csr_batch(rows: sp.csr_matrix) -> SparseBatch:
    """A CSR chunk (e.g. validation fold-in rows) as an unpadded ``SparseBatch``."""
    counts = np.diff(rows.indptr)
    return SparseBatch(
        rows=tf.constant(np.repeat(np.arange(rows.shape[0], dtype=np.int64), counts)),
        item_idx=tf.constant(rows.indices.astype(np.int64)),
        values=tf.constant(rows.data.astype(np.float32)),
        user_idx=tf.range(rows.shape[0], dtype=tf.int64))
