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
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

ReduceSum = Callable[[np.ndarray], np.ndarray]


def alone(value: np.ndarray) -> np.ndarray:
    """The sum over every item when this process holds them all: the partial sum itself."""
    return value


def embeddings(w: np.ndarray, x: sp.csr_matrix, lam: float, alpha: float, threshold: int,
               reduce_sum: ReduceSum = alone) -> np.ndarray:
    """ImplicitSLIM's embedding [d, items] from ``w`` [d, items] (see the module docstring).

    Args:
      w: the current embedding of the items this process holds (all of them, or a shard).
      x: [users, items] training matrix of the same items (every training user).
      lam: the ridge penalty (as EASE's lambda); alpha: the scale of the low-rank update.
      threshold: items with fewer training users keep no say in ``A`` (their own embedding
        is still replaced).
      reduce_sum: adds a partial sum over items over the shards (identity: all items here).
    """
    x = x.astype(np.float64)
    counts = np.asarray(x.sum(axis=0)).ravel()
    a = np.where(counts[np.newaxis, :] < threshold, 0.0, w.astype(np.float64))
    scale = 1.0 / np.square(counts + lam)

    def cooccur(y: np.ndarray) -> np.ndarray:  # y X^T X, [d, items]
        return np.asarray((x.T @ reduce_sum(np.asarray(x @ y.T))).T)

    m = (lam * a + cooccur(a)) * scale
    c = lam * m + cooccur(m)
    k = reduce_sum(c @ a.T)
    update = c - k @ np.linalg.solve(np.eye(k.shape[0]) / alpha + k, c)
    return (alpha * reduce_sum(w.astype(np.float64) @ a.T) @ update).astype(w.dtype)
