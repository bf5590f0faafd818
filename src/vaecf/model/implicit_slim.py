"""ImplicitSLIM (Shenbin & Nikolenko, ICLR 2024): item embeddings from a closed form.

Every few epochs (``--implicit-slim-every``) the two item embeddings of the model (the
first layer's kernel and the decoder's) are replaced by what an EASE-like (SLIM) model of the
item co-occurrences makes of them, without ever forming the [items, items] matrix: with
``W`` [d, items] the embedding, ``X`` [users, items] the training matrix, ``A`` = ``W`` with
the columns of items seen by fewer than ``threshold`` users set to 0, ``D`` = 1 / (item
counts + lambda) and ``G(Y) = Y X^T X`` (two sparse products):

    M = (lambda A + G(A)) D^2,   C = lambda M + G(M),   K = C A^T  [d, d]
    W' = alpha (W A^T) (C - K (I / alpha + K)^-1 C)

Every product is [d, items] by a sparse matrix or a sum over items of [d, items] x [items, d],
so an item shard (``--shard-items``) computes its own columns: the sums over items are
partial on each rank and added by ``reduce_sum`` (an allreduce), nothing item-sized moves.
The training matrix is held by user shares (each Horovod rank its own users' rows): the
item counts and ``G`` are sums over users, each rank's part added over the ranks
(``products``), and with item shards ``X Y^T`` gathers each shard's ``Y`` in turn, so a rank
holds one shard of it at a time.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

ReduceSum = Callable[[np.ndarray], np.ndarray]
Cooccur = Callable[[np.ndarray], np.ndarray]
Broadcast = Callable[[np.ndarray, int], np.ndarray]


def alone(value: np.ndarray) -> np.ndarray:
    """The sum over every item (or user) when this process holds them all: the value."""
    return value


def products(x: sp.csr_matrix, shards: list[slice], mine: int,
             sum_users: ReduceSum = alone,
             broadcast: Broadcast | None = None) -> tuple[np.ndarray, Cooccur]:
    """The item counts and ``G(Y) = Y X^T X`` of this process's items.

    Args:
      x: [this process's users, every item (padded)] training rows.
      shards: the item columns of each item shard (one: every item here).
      mine: the shard this process holds (``Y`` and the results are its columns).
      sum_users: adds a partial sum over users over the processes (identity: every user).
      broadcast: ``(value, shard)``: shard ``shard``'s value on every process (several
        shards only).

    Returns:
      (counts [items held], cooccur [d, items held] -> [d, items held]).
    """
    x = x.astype(np.float64)
    counts = sum_users(np.asarray(x.sum(axis=0)).ravel())[shards[mine]]

    def cooccur(y: np.ndarray) -> np.ndarray:
        if len(shards) == 1:
            z = np.asarray(x @ y.T)
        else:
            assert broadcast is not None
            z = np.zeros((x.shape[0], y.shape[0]))
            for s, columns in enumerate(shards):  # one shard of Y held at a time
                z += np.asarray(x[:, columns] @ broadcast(y, s).T)
        out = y
        for s, columns in enumerate(shards):  # every process takes part in every sum
            part = sum_users(np.asarray(x[:, columns].T @ z))
            if s == mine:
                out = part.T
        return out

    return counts, cooccur


def embeddings(w: np.ndarray, counts: np.ndarray, cooccur: Cooccur, lam: float, alpha: float,
               threshold: int, reduce_sum: ReduceSum = alone) -> np.ndarray:
    """ImplicitSLIM's embedding [d, items] from ``w`` [d, items] (see the module docstring).

    Args:
      w: the current embedding of the items this process holds (all of them, or a shard).
      counts, cooccur: ``products`` of the training matrix for the same items.
      lam: the ridge penalty (as EASE's lambda); alpha: the scale of the low-rank update.
      threshold: items with fewer training users keep no say in ``A`` (their own embedding
        is still replaced).
      reduce_sum: adds a partial sum over items over the shards (identity: all items here).
    """
    a = np.where(counts[np.newaxis, :] < threshold, 0.0, w.astype(np.float64))
    scale = 1.0 / np.square(counts + lam)
    m = (lam * a + cooccur(a)) * scale
    c = lam * m + cooccur(m)
    k = reduce_sum(c @ a.T)
    update = c - k @ np.linalg.solve(np.eye(k.shape[0]) / alpha + k, c)
    return (alpha * reduce_sum(w.astype(np.float64) @ a.T) @ update).astype(w.dtype)
