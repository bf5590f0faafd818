"""Most-popular baseline: every user gets the items ranked by their count in training.

The floor any personalised model must clear. Scores are the number of training users of each
item; the evaluation masks each user's fold-in items, so the same popular list is shifted past
what the user already has. Ties (equal counts) rank the lower item_idx first, like any score.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


class Popularity:
    """``score_batch`` of the popularity baseline.

    Args:
      train: CSR (train users, n_items); stored non-zeros are the interactions.
    """

    def __init__(self, train: sp.csr_matrix) -> None:
        binary = sp.csr_matrix(train, copy=True)
        binary.eliminate_zeros()
        binary.sum_duplicates()
        # Column counts over the structure (not the values): users per item.
        self.counts = np.bincount(binary.indices, minlength=binary.shape[1]).astype(np.float32)

    def __call__(self, rows: sp.csr_matrix) -> np.ndarray:
        """float32 (B, n_items): the same popularity scores for every user of the chunk."""
        return np.broadcast_to(self.counts, (rows.shape[0], self.counts.size)).copy()
