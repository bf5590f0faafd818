"""EASE (Steck, "Embarrassingly Shallow Autoencoders for Sparse Data", WWW 2019).

An item-item linear model with a closed form. With X the binary train matrix (users x items)
and lambda the L2 weight:

    P = (X^T X + lambda I)^-1
    B = I - P / diag(P)      (column j divided by P_jj), i.e. B_ij = -P_ij / P_jj, B_jj = 0

and a user's scores are x_u B. The zero diagonal is the constraint that stops an item from
predicting itself. Steck uses lambda = 500 on ML-20M (1000 on Netflix); 500 is the default.

Numerics and memory (n = n_items, 20,108 on ML-20M): the Gram matrix is built in float64 by
column blocks of the sparse product (never a users x items dense array; sparse memory bounded
by the block), then inverted in place by a float64 Cholesky factorisation (X^T X + lambda I
is symmetric positive definite; float32 would lose ~cond x 6e-8 relative accuracy, visibly
so when item counts reach 10^4-10^5). Peak is one float64 n x n (3.2 GB at n = 20k) plus the
float32 B kept for scoring (1.6 GB). Scoring is a sparse (B, n) x dense (n, n) product.
A catalogue whose 12 n^2 bytes exceed the memory available is refused before allocating
(1M items would need 11 TiB).
"""

from __future__ import annotations

import os

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from vaecf.errors import VaecfError
from vaecf.host import GIB, available_bytes
from vaecf.log import Progress, heartbeat, info

DEFAULT_LAMBDA = 500.0
_GRAM_BLOCK = 2048


def needed_bytes(n_items: int) -> int:
    """Peak memory of the closed form: the float64 Gram matrix inverted in place plus the
    float32 B built from it (12 bytes per item pair)."""
    return 12 * n_items * n_items


def check_fits(n_items: int, available: int) -> None:
    """Refuse, before allocating, a catalogue whose closed form does not fit in memory (a
    process killed by the kernel says nothing)."""
    needed = needed_bytes(n_items)
    if needed > available:
        raise VaecfError(f"EASE: {n_items:,} items need {needed / GIB:,.1f} GiB for the "
                         f"{n_items:,} x {n_items:,} Gram matrix and weights, "
                         f"{available / GIB:,.1f} GiB is available (leave ease out of "
                         "--baselines for this catalogue)")


def gram(train: sp.csr_matrix, block: int = _GRAM_BLOCK) -> np.ndarray:
    """float64 (n, n) X^T X of the binary train matrix, built one column block at a time."""
    binary = sp.csr_matrix(train, copy=True)
    binary.eliminate_zeros()
    binary.sum_duplicates()
    binary.data = np.ones_like(binary.data, dtype=np.float64)
    left = binary.T.tocsr()
    columns = binary.tocsc()
    n = binary.shape[1]
    out = np.zeros((n, n), dtype=np.float64)
    progress = Progress("EASE Gram matrix", total=n, unit="items")
    for start in range(0, n, block):
        stop = min(start + block, n)
        out[:, start:stop] = (left @ columns[:, start:stop]).toarray()
        progress.update(stop - start)
    progress.close()
    return out


def ease_weights(train: sp.csr_matrix, l2: float = DEFAULT_LAMBDA) -> np.ndarray:
    """float32 (n, n) EASE item-item weights B with a zero diagonal (formula above)."""
    if not l2 > 0:
        raise VaecfError(f"--ease-lambda must be > 0, got {l2}")
    check_fits(train.shape[1], memory_bytes())
    return weights_from_gram(gram(train), l2)


def memory_bytes() -> int:
    """The memory the closed form may take: what is available, else the machine's."""
    free = available_bytes()
    return free if free is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def weights_from_gram(matrix: np.ndarray, l2: float) -> np.ndarray:
    """float32 (n, n) B from X^T X (float64 (n, n), overwritten: inverted in place), as
    ``ease_weights``; the Gram matrix may be a sum over processes' shares of the users."""
    matrix[np.diag_indices_from(matrix)] += l2
    info(f"EASE: inverting a {matrix.shape[0]:,} x {matrix.shape[0]:,} float64 matrix "
         f"(lambda {l2:g}; Cholesky, in place)")
    # The matrix is symmetric, so its transpose is the same matrix in Fortran order: LAPACK
    # then works in place instead of copying 3.2 GB.
    with heartbeat("EASE: Cholesky factorisation"):
        factor, status = scipy.linalg.lapack.dpotrf(matrix.T, lower=1, clean=0, overwrite_a=1)
    if status == 0:
        with heartbeat("EASE: inverse from the factor"):
            factor, status = scipy.linalg.lapack.dpotri(factor, lower=1, overwrite_c=1)
    if status != 0:
        raise VaecfError(f"EASE: X^T X + lambda I is not invertible (LAPACK status {status}); "
                         "try a larger --ease-lambda")
    return _weights_from_lower_inverse(factor)


def _weights_from_lower_inverse(inverse: np.ndarray, block: int = _GRAM_BLOCK) -> np.ndarray:
    """float32 B = -P / diag(P), zero diagonal, from P whose lower triangle alone is valid.

    Built one block of rows at a time so that no second float64 n x n array is allocated.
    """
    n = inverse.shape[0]
    diagonal = inverse.diagonal().copy()
    weights = np.empty((n, n), dtype=np.float32)
    progress = Progress("EASE weights", total=n, unit="items")
    for start in range(0, n, block):
        stop = min(start + block, n)
        # Row r of P: P[r, c] = lower[r, c] for c <= r, lower[c, r] for c > r.
        rows = (np.tril(inverse[start:stop, :], k=start)
                + np.triu(inverse[:, start:stop].T, k=start + 1))
        weights[start:stop] = rows / -diagonal
        progress.update(stop - start)
    progress.close()
    np.fill_diagonal(weights, 0.0)
    return weights


class Ease:
    """``score_batch`` of EASE.

    Args:
      train: CSR (train users, n_items).
      l2: lambda, the L2 weight of the closed form.
    """

    def __init__(self, train: sp.csr_matrix, l2: float = DEFAULT_LAMBDA) -> None:
        self.l2 = l2
        self.weights = ease_weights(train, l2)

    def __call__(self, rows: sp.csr_matrix) -> np.ndarray:
        """float32 (B, n_items): x_u B for each user of the chunk (binary fold-in rows)."""
        binary = sp.csr_matrix(rows, copy=True)
        binary.eliminate_zeros()
        binary.data = np.ones_like(binary.data, dtype=np.float32)
        return np.asarray(binary @ self.weights, dtype=np.float32)
