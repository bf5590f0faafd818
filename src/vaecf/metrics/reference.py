"""Recall@K and NDCG@K: the numpy reference, exactly as Liang et al. (WWW 2018) define them.

For one user with fold-in items F (fed to the model) and holdout items H (to predict), the
model's scores over all ``n_items`` training items are ranked with F removed, giving a ranking
``i_1, i_2, ...`` of the remaining items. With ``hit_r = 1 if i_r in H else 0``:

    Recall@K = sum_{r=1..K} hit_r / min(K, |H|)
    DCG@K    = sum_{r=1..K} hit_r / log2(r + 1)
    IDCG@K   = sum_{r=1..min(K, |H|)} 1 / log2(r + 1)
    NDCG@K   = DCG@K / IDCG@K

Ties are broken deterministically: a higher score ranks first, and among equal scores the
lower ``item_idx`` ranks first (the rule of ``tf.math.top_k``, so the TensorFlow version ranks
identically). When fewer than K items remain after removing F (K larger than the item count),
the ranking is simply shorter; the denominators are unchanged. The metrics are undefined for a
user with an empty holdout: these functions refuse such users, and ``vaecf.metrics.evaluate``
excludes and counts them before calling anything here.

This module is the slow, obviously-correct version that the batched TensorFlow version
(``vaecf.metrics.batched``) is tested against; it holds dense (users, n_items) arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

# (metric key, kind, K): the metrics every report carries (DESIGN.md section 3).
METRICS: tuple[tuple[str, str, int], ...] = (
    ("recall_at_20", "recall", 20),
    ("recall_at_50", "recall", 50),
    ("ndcg_at_100", "ndcg", 100),
)


def rank_top_k(scores: np.ndarray, fold_in: sp.csr_matrix, k: int) -> np.ndarray:
    """The top ``k`` items of every user, fold-in items excluded.

    Args:
      scores: float (users, n_items), finite.
      fold_in: CSR (users, n_items); stored non-zeros are the items to exclude.
      k: how many items to rank (>= 1); capped at ``n_items``.

    Returns:
      int64 (users, min(k, n_items)): item_idx by rank (higher score first, then lower
      item_idx); -1 where fewer items than that remain after excluding the fold-in.
    """
    scores = np.asarray(scores)
    if not np.all(np.isfinite(scores)):
        raise ValueError("scores must be finite (NaN or infinity cannot be ranked)")
    k = min(k, scores.shape[1])
    excluded = sp.csr_matrix(fold_in).toarray() != 0
    masked = np.where(excluded, -np.inf, scores.astype(np.float64))
    order = np.argsort(-masked, axis=1, kind="stable")[:, :k]
    ranked = ~np.take_along_axis(excluded, order, axis=1)
    return np.where(ranked, order, -1)


def metrics_from_ranking(top: np.ndarray, holdout: sp.csr_matrix,
                         metrics: Sequence[tuple[str, str, int]] = METRICS
                         ) -> dict[str, np.ndarray]:
    """Per-user metrics of a ranking (see the module docstring for the formulas).

    Args:
      top: int (users, k) item_idx by rank from ``rank_top_k``, -1 for "no item"; k must be
        at least the largest K asked for, or the item count.
      holdout: CSR (users, n_items); every row non-empty.
      metrics: (key, "recall" | "ndcg", K) triples.

    Returns:
      key -> float64 (users,) values.
    """
    relevant = sp.csr_matrix(holdout).toarray() != 0
    n_holdout = relevant.sum(axis=1)
    if np.any(n_holdout == 0):
        raise ValueError("every user needs a non-empty holdout (the metrics are undefined)")
    hits = np.take_along_axis(relevant, np.maximum(top, 0), axis=1) & (top >= 0)
    discount = 1.0 / np.log2(np.arange(2, top.shape[1] + 2))
    values: dict[str, np.ndarray] = {}
    for key, kind, k in metrics:
        if kind == "recall":
            values[key] = hits[:, :k].sum(axis=1) / np.minimum(k, n_holdout)
        elif kind == "ndcg":
            dcg = (hits[:, :k] * discount[:k]).sum(axis=1)
            ideal_discount = 1.0 / np.log2(np.arange(2, k + 2))
            idcg = np.cumsum(ideal_discount)[np.minimum(k, n_holdout) - 1]
            values[key] = dcg / idcg
        else:
            raise ValueError(f"unknown metric kind '{kind}' (recall or ndcg)")
    return values


def recall_at_k(scores: np.ndarray, fold_in: sp.csr_matrix, holdout: sp.csr_matrix,
                k: int) -> np.ndarray:
    """Per-user Recall@K = hits in the top K / min(K, |holdout|), fold-in excluded.

    Args:
      scores: float (users, n_items); fold_in, holdout: CSR (users, n_items).

    Returns:
      float64 (users,).
    """
    top = rank_top_k(scores, fold_in, k)
    return metrics_from_ranking(top, holdout, [("recall", "recall", k)])["recall"]


def ndcg_at_k(scores: np.ndarray, fold_in: sp.csr_matrix, holdout: sp.csr_matrix,
              k: int) -> np.ndarray:
    """Per-user NDCG@K: gain 1/log2(rank + 1), IDCG over min(K, |holdout|) ranks.

    Args:
      scores: float (users, n_items); fold_in, holdout: CSR (users, n_items).

    Returns:
      float64 (users,).
    """
    top = rank_top_k(scores, fold_in, k)
    return metrics_from_ranking(top, holdout, [("ndcg", "ndcg", k)])["ndcg"]


def mean_stderr(values: np.ndarray) -> tuple[float, float]:
    """Mean and standard error of per-user values, as in Liang et al.'s code.

    stderr = std(values) / sqrt(n) with the population standard deviation (ddof=0), which
    is what the published tables report; it differs from the ddof=1 estimate by a factor
    sqrt(n / (n - 1)), under 0.01% at 10,000 users, and stays defined for n = 1.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no values: the mean is undefined")
    return float(values.mean()), float(values.std() / np.sqrt(values.size))


PAIRED_TEST = "paired z-test on per-user differences"


def paired_difference(model: np.ndarray, baseline: np.ndarray
                      ) -> dict[str, float | int | str | None]:
    """Paired comparison of two scorers' per-user values on the same users.

    d_u = model_u - baseline_u; delta = mean(d), stderr = std(d) / sqrt(n) (ddof=0, as
    ``mean_stderr``), z = delta / stderr (None when every d_u is equal: undefined). Pairing
    removes the between-user variance that unpaired standard errors keep, so a consistent
    difference of 0.03 over 4,000 users is significant where the unpaired errors say noise.

    Args:
      model, baseline: (n,) per-user values of the same users in the same order.
    """
    model, baseline = np.asarray(model, np.float64), np.asarray(baseline, np.float64)
    if model.shape != baseline.shape:
        raise ValueError(f"paired values differ in shape: {model.shape} vs {baseline.shape}")
    delta, stderr = mean_stderr(model - baseline)
    return {"test": PAIRED_TEST, "users": int(model.size), "delta": delta, "stderr": stderr,
            "z": delta / stderr if stderr > 0 else None}
