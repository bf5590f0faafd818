"""Input pipeline: users' CSR rows -> sparse batches, gathered where the matrix lives.

The training matrix stays in CSR form; a batch is a gather of rows, never a dense users x
items array.

Sharding: rank ``r`` of ``W`` trains a contiguous share of the training users,
``[r*n/W, (r+1)*n/W)`` (``user_share``), and holds only their rows (the split's row groups
let it read only those). Each epoch it draws a permutation of its share from ``(seed, epoch,
pass, rank)``; its part of global step ``k`` is positions ``k*B/W .. (k+1)*B/W`` of that
permutation, wrapping around, so every rank takes the same number of full steps. Global
step ``k`` is the union of the ranks' parts. With ``W = 1`` the one permutation is drawn from
``(seed, epoch)`` as it always was. Every rank computes every rank's users
(``all_ranks_users``) from these numbers alone, without reading their rows, and one process
can train the batches of ``W`` shares (``--user-shares``).

The entries of a batch are padded (value 0 entries) to a size the host chooses: a multiple of
a fixed granule, or under ``--xla`` and ``--shard-items`` one size per epoch, so the compiled
step sees a shape or two per run instead of one per batch (and sharded ranks, whose step
holds collectives, step on the same shape).

Placement (decided here alone, STYLE.md 13): the CSR arrays live on the GPU on a GPU host
(ML-20M's are ~40 MB), in host memory on a CPU host, with each pass's permutation placed
beside them once (``call_inputs``); the training loop gathers each step's batch there, inside
its compiled call of many steps (``BatchMaker.gather``, ops with GPU and XLA kernels;
``vaecf.train.calls``), so nothing crosses from the host per step (the host tf.data pipeline
was 18-22% of an H100 epoch under --xla, DESIGN.md section 8, and 5.2 ms of a 6.3 ms step at
batch 4096).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp
import tensorflow as tf

from vaecf.data.splits import user_share
from vaecf.model import SparseBatch


def steps_per_epoch(n_users: int, batch_size: int, requested: int | None) -> int:
    """One pass over the users (the last batch wraps around), unless a count is requested."""
    return requested if requested is not None else max(1, math.ceil(n_users / batch_size))


def epoch_users(n_users: int, *, seed: int, epoch: int, steps: int, batch_size: int,
                world_size: int, rank: int) -> np.ndarray:
    """Training users of this rank's batches in ``epoch`` (1-based): int64 [steps, B / W].

    Args:
      n_users: every training user (all ranks' shares).
      batch_size: the global batch B (divisible by ``world_size``).
    """
    return all_ranks_users(n_users, seed=seed, epoch=epoch, steps=steps,
                           batch_size=batch_size, world_size=world_size)[:, rank, :]


def all_ranks_users(n_users: int, *, seed: int, epoch: int, steps: int, batch_size: int,
                    world_size: int, pass_index: int = 0) -> np.ndarray:
    """Every rank's ``epoch_users``: int64 [steps, W, B / W] (each rank can compute all).

    Rank ``r``'s users are drawn from its ``user_share`` alone, by its own permutation.

    ``pass_index``: the pass within the epoch (``--alternate`` makes several), each its own
    permutation; pass 0 is the epoch's one permutation of a joint epoch.
    """
    local = batch_size // world_size
    users = np.empty((steps, world_size, local), np.int64)
    for rank in range(world_size):
        share = user_share(n_users, world_size, rank)
        if world_size == 1:  # the key one process always used: its runs stay as they were
            key = [seed, epoch] if pass_index == 0 else [seed, epoch, pass_index]
        else:
            key = [seed, epoch, pass_index, rank]
        order = share.start + np.random.default_rng(key).permutation(len(share))
        users[:, rank] = np.resize(order, steps * local).reshape(steps, local)  # cyclic
    return users


def pad_granule(nnz: int, n_users: int, local_batch: int) -> int:
    """A power of two near 1/32 of a batch's expected entries (padding costs <= ~3%).

    Args:
      nnz, n_users: of the whole training matrix (every rank's share): the same on every
        rank, so that ranks padding to one size pad to the same one.
    """
    mean_nnz = nnz / max(n_users, 1) * local_batch
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
    """Gathers CSR rows into ``SparseBatch`` es where the matrix lives: ``device``, else the host.

    Each batch's entries are padded to a size the host chooses (``padded_sizes``) from the
    row lengths it keeps, so no op waits on the device to learn a shape, and padding is
    built by ops with GPU kernels (an int64 ``tf.pad`` has none: it sent every resident
    batch device -> host -> device). Padding entries have value 0 and the batch's last row.

    Users given to the maker are training users (``user_idx``); row ``u - first`` of
    ``matrix`` is user ``u``.

    Args:
      matrix: CSR [users, items] rows of the training users this rank holds (its share, or
        all), float32 values.
      granule: entries are padded to a multiple of this (1: no padding).
      device: keep the matrix on this device and gather batches there (``resident_device``).
      one_size: pad every batch of an epoch to one size, a ``bucket`` of the largest batch
        of any rank (``--xla`` compiles the step once per shape: per batch, 12-15 compiles
        at batch 500 on ML-20M-shaped data, each at different steps on different ranks;
        ``--shard-items`` ranks must run the same collectives on the same shapes).
      first: the training user of the matrix's row 0 (the start of this rank's share).
      lengths: int64 [every training user]: each one's items (``one_size`` sizes every
        rank's batches, whose rows other ranks hold). Default: the matrix's own rows.
    """

    def __init__(self, matrix: sp.csr_matrix, granule: int = 1,
                 device: str | None = None, one_size: bool = False, first: int = 0,
                 lengths: np.ndarray | None = None) -> None:
        self.device, self._granule, self._one_size = device, granule, one_size
        self._own = np.diff(matrix.indptr).astype(np.int64)
        self._first = first
        if lengths is None and first and one_size:
            raise ValueError("one_size over a share of the users needs every user's lengths")
        self._lengths = self._own if lengths is None else lengths
        with tf.device(device or "/CPU:0"):
            self._offset = tf.constant(first, tf.int64)
            self._indptr = tf.constant(matrix.indptr.astype(np.int64))
            self._indices = tf.constant(matrix.indices.astype(np.int64))
            self._data = tf.constant(matrix.data.astype(np.float32))

    def padded_sizes(self, users: np.ndarray, rank: int = 0) -> np.ndarray:
        """Entries of each of ``rank``'s batches after padding: int64 [steps].

        Args:
          users: every rank's rows, int64 [steps, W, b] (``all_ranks_users``).
        """
        if self._one_size:  # the same on every rank: computed from every rank's batches
            nnz = self._lengths[users].sum(axis=2)  # [steps, W]
            return np.full(len(users), bucket(int(nnz.max(initial=0)), self._granule))
        own = self._own[users[:, rank] - self._first].sum(axis=1)
        return -(-own // self._granule) * self._granule

    def gather(self, users: tf.Tensor, padded: tf.Tensor | int) -> SparseBatch:
        """The rows ``users`` (int64 [b]) padded to ``padded`` entries, by ops with GPU kernels
        (RaggedGather has only a CPU kernel) and XLA's (a Python int ``padded`` gives every
        output a static shape): the gather of each step inside the training loop's compiled
        call (``vaecf.train.calls``).

        ``padded`` is a host scalar, so ``tf.range`` (whose GPU kernel reads its limit from
        host memory) does not wait for the device's cumsum.
        """
        local = users - self._offset
        starts = tf.gather(self._indptr, local)
        splits = tf.concat([tf.zeros([1], tf.int64),
                            tf.cumsum(tf.gather(self._indptr, local + 1) - starts)], 0)
        entry = tf.range(padded, dtype=tf.int64)  # int64 start and delta: no Cast on device
        real = entry < splits[-1]
        last = tf.shape(users, out_type=tf.int64)[0] - 1
        rows = tf.minimum(tf.searchsorted(splits, entry, side="right", out_type=tf.int64) - 1,
                          last)  # padding: the last row
        position = tf.where(real, tf.gather(starts, rows) + entry - tf.gather(splits, rows), 0)
        items = tf.where(real, tf.gather(self._indices, position), 0)
        values = tf.where(real, tf.gather(self._data, position), 0.0)
        return SparseBatch(rows=rows, item_idx=items, values=values, user_idx=users)


def call_inputs(maker: BatchMaker, users: np.ndarray, padded: np.ndarray,
                static: bool) -> tuple[tf.Tensor, tf.Tensor | int]:
    """A pass's inputs to the training loop's calls, placed once per pass: the users of its
    steps (int64 [steps, b]) where the matrix lives, and the padded entries of each step,
    int64 [steps] in host memory (``tf.range`` reads its limit there on a GPU), or with
    ``static`` the pass's one size as a Python int (XLA compiles shapes, not values; the
    maker pads a pass to one size when ``one_size``)."""
    with tf.device(maker.device or "/CPU:0"):
        placed = tf.constant(users)
    if static:
        if len(set(padded.tolist())) != 1:
            raise ValueError("a static padded size needs a maker that pads to one size")
        return placed, int(padded[0])
    with tf.device("/CPU:0"):
        return placed, tf.constant(padded, tf.int64)


def csr_batch(rows: sp.csr_matrix) -> SparseBatch:
    """A CSR chunk (e.g. validation fold-in rows) as an unpadded ``SparseBatch``."""
    counts = np.diff(rows.indptr)
    return SparseBatch(
        rows=tf.constant(np.repeat(np.arange(rows.shape[0], dtype=np.int64), counts)),
        item_idx=tf.constant(rows.indices.astype(np.int64)),
        values=tf.constant(rows.data.astype(np.float32)),
        user_idx=tf.range(rows.shape[0], dtype=tf.int64))
