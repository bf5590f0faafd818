"""``evaluate``: Recall@20, Recall@50 and NDCG@100 of any scorer over a fold-in/holdout pair.

The trainer (validation), the evaluate stage (models and baselines) and the benchmark all go
through this one function, so every number in a report is computed the same way. A scorer is
any ``score_batch(rows) -> scores`` callable: given the fold-in rows of a chunk of users
(CSR, (B, n_items)) it returns their unmasked float32 scores (B, n_items) as a tf.Tensor or a
numpy array. Users are processed ``batch_users`` at a time, so memory is bounded by the chunk,
and every user is evaluated, including the last partial chunk.

TensorFlow is imported only when the TensorFlow engine runs, so importing this module (and
scoring baselines with the numpy engine) stays light.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from vaecf.errors import VaecfError
from vaecf.log import Progress
from vaecf.metrics.reference import METRICS, mean_stderr, metrics_from_ranking, rank_top_k

ScoreBatch = Callable[[sp.csr_matrix], Any]
ENGINES = ("tensorflow", "numpy")
# Scores of one chunk, users x items (512 MiB of float32): at 1M items a chunk of 4,096 users
# would hold 16 GB per array; at ML-20M's 20k items the cap is above every default chunk.
SCORE_CELLS = 1 << 27


def chunk_users(batch_users: int, n_items: int) -> int:
    """Users per scoring chunk: ``batch_users``, fewer where the chunk's (B, n_items) scores
    would pass ``SCORE_CELLS``, at least 1."""
    return max(1, min(batch_users, SCORE_CELLS // max(n_items, 1)))


@dataclass(frozen=True)
class MetricValue:
    """Mean over evaluated users and its standard error (``reference.mean_stderr``)."""

    mean: float
    stderr: float


@dataclass(frozen=True, eq=False)
class TopK:
    """The top items of every evaluated user, from the same ranking as the metrics.

    Attributes:
      users: int64 (U,): row of each evaluated user in the fold-in/holdout matrices.
      item_idx: int32 (U, k): items by rank; -1 where the user has fewer candidate items.
      scores: float32 (U, k): their scores.
    """

    users: np.ndarray
    item_idx: np.ndarray
    scores: np.ndarray


@dataclass(frozen=True, eq=False)
class Evaluation:
    """Result of ``evaluate``.

    Attributes:
      metrics: metric key (``recall_at_20``, ``recall_at_50``, ``ndcg_at_100``) -> value.
      users_evaluated: users with a non-empty holdout (the ones averaged).
      users_skipped: users with an empty holdout (excluded: their metrics are undefined).
      seconds: wall time of scoring and ranking.
      device: where the ranking ran (e.g. ``/device:GPU:0``, or ``numpy``).
      top_k: the top items per evaluated user if asked for.
      batch_users: users per chunk (every chunk is whole but maybe the last).
      chunk_seconds: wall time of each chunk, in order. The first traces the scorer and the
        ranking (start-up); a partial last chunk pays the same fixed per-chunk cost (host
        work, dispatch, syncs) for fewer users. Neither is the per-user rate.
      per_user: metric key -> float64 (users_evaluated,): each evaluated user's value, in
        row order, so that two scorers on the same users can be compared pairwise.
    """

    metrics: Mapping[str, MetricValue]
    users_evaluated: int
    users_skipped: int
    seconds: float
    device: str
    top_k: TopK | None = None
    batch_users: int = 1
    chunk_seconds: tuple[float, ...] = ()
    per_user: Mapping[str, np.ndarray] = field(default_factory=dict)

    @property
    def first_chunk_seconds(self) -> float:
        return self.chunk_seconds[0] if self.chunk_seconds else 0.0

    @property
    def first_chunk_users(self) -> int:
        return min(self.batch_users, self.users_evaluated)

    @property
    def steady_chunks(self) -> tuple[float, ...]:
        """Seconds of the whole chunks after the first: the ones the steady rate is made of."""
        whole = self.users_evaluated // self.batch_users
        return self.chunk_seconds[1:whole]

    @property
    def users_per_second(self) -> float | None:
        """The steady rate: users of the whole chunks after the first over their time; None
        when there is no such chunk (too few users for ``batch_users``: no rate is better
        than one made of start-up or of a partial chunk's fixed cost)."""
        steady = self.steady_chunks
        if not steady:
            return None
        return len(steady) * self.batch_users / max(sum(steady), 1e-9)

    def summary(self) -> dict[str, Any]:
        """The metric part of ``metrics.json`` (contracts): metric keys and user counts."""
        out: dict[str, Any] = {key: {"mean": value.mean, "stderr": value.stderr}
                               for key, value in self.metrics.items()}
        out["users_evaluated"] = self.users_evaluated
        out["users_skipped"] = self.users_skipped
        return out


def evaluate(score_batch: ScoreBatch, fold_in: sp.csr_matrix, holdout: sp.csr_matrix, *,
             batch_users: int = 1024, engine: str = "tensorflow",
             top_k: int | None = None) -> Evaluation:
    """Evaluate a scorer on the users of ``fold_in``/``holdout`` (same rows, same users).

    Args:
      score_batch: (B, n_items) CSR fold-in rows -> float32 (B, n_items) unmasked scores.
      fold_in, holdout: CSR (users, n_items).
      batch_users: users per chunk (bounds memory: a few B x n_items arrays), lowered
        for large catalogues (``chunk_users``).
      engine: ``tensorflow`` (batched, on GPU when there is one) or ``numpy`` (reference).
      top_k: also keep this many top items per evaluated user (``Evaluation.top_k``).

    Raises:
      VaecfError: shapes differ, no user has a holdout, or the scorer returns a wrong
        shape or non-finite scores.
    """
    fold_in, holdout = _check_inputs(fold_in, holdout, batch_users, engine, top_k)
    users = np.flatnonzero(np.diff(holdout.indptr) > 0)
    if users.size == 0:
        raise VaecfError(f"none of the {holdout.shape[0]} users has a holdout item: "
                         "nothing to evaluate")
    skipped = holdout.shape[0] - users.size
    fold_in, holdout = fold_in[users], holdout[users]
    chunk_metrics, device = _engine(engine, holdout.shape[1], top_k)
    batch_users = chunk_users(batch_users, holdout.shape[1])
    values: dict[str, list[np.ndarray]] = {key: [] for key, _, _ in METRICS}
    tops: list[tuple[np.ndarray, np.ndarray]] = []
    progress = Progress("evaluating", total=users.size, unit="users")
    started = time.perf_counter()
    chunk_seconds = []
    for start in range(0, users.size, batch_users):
        chunk_started = time.perf_counter()
        rows = fold_in[start:start + batch_users]
        out = chunk_metrics(score_batch(rows), rows, holdout[start:start + batch_users])
        for key in values:
            values[key].append(out[key])
        if top_k is not None:
            tops.append((out["top_items"], out["top_scores"]))
        chunk_seconds.append(time.perf_counter() - chunk_started)  # out is on the host
        progress.update(rows.shape[0])
    seconds = time.perf_counter() - started
    progress.close()
    per_user = {key: np.concatenate(parts).astype(np.float64) for key, parts in values.items()}
    metrics = {key: MetricValue(*mean_stderr(value)) for key, value in per_user.items()}
    top = None if top_k is None else TopK(
        users=users.astype(np.int64), item_idx=np.concatenate([t[0] for t in tops]),
        scores=np.concatenate([t[1] for t in tops]))
    return Evaluation(metrics=metrics, users_evaluated=int(users.size),
                      users_skipped=int(skipped), seconds=seconds, device=device, top_k=top,
                      batch_users=batch_users, chunk_seconds=tuple(chunk_seconds),
                      per_user=per_user)


def _check_inputs(fold_in: sp.csr_matrix, holdout: sp.csr_matrix, batch_users: int,
                  engine: str, top_k: int | None) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """Canonical CSR copies (explicit zeros dropped) after checking the arguments."""
    if fold_in.shape != holdout.shape:
        raise VaecfError(f"fold-in shape {fold_in.shape} differs from holdout shape "
                         f"{holdout.shape}")
    if batch_users < 1:
        raise VaecfError(f"batch_users must be >= 1, got {batch_users}")
    if top_k is not None and top_k < 1:
        raise VaecfError(f"top-k must be >= 1, got {top_k}")
    if engine not in ENGINES:
        raise VaecfError(f"unknown engine '{engine}' (one of: {', '.join(ENGINES)})")
    canonical = []
    for matrix in (fold_in, holdout):
        matrix = sp.csr_matrix(matrix, copy=True)
        matrix.eliminate_zeros()
        matrix.sum_duplicates()
        canonical.append(matrix)
    return canonical[0], canonical[1]


ChunkFn = Callable[[Any, sp.csr_matrix, sp.csr_matrix], dict[str, np.ndarray]]


def _engine(engine: str, n_items: int, top_k: int | None) -> tuple[ChunkFn, str]:
    """The per-chunk function of ``engine`` (checking the scores) and its device name."""
    if engine == "numpy":
        compute: ChunkFn = _numpy_chunk(n_items, top_k)
        device = "numpy"
    else:
        import tensorflow as tf

        compute = _chunk_metrics(n_items, top_k)
        gpus = tf.config.list_logical_devices("GPU")
        device = gpus[0].name if gpus else "/device:CPU:0"

    def checked(scores: Any, fold_in: sp.csr_matrix, holdout: sp.csr_matrix
                ) -> dict[str, np.ndarray]:
        if tuple(scores.shape) != fold_in.shape:
            raise VaecfError(f"the scorer returned scores of shape {tuple(scores.shape)} for "
                             f"{fold_in.shape[0]} users x {n_items} items")
        out = compute(scores, fold_in, holdout)
        if not out["finite"]:
            raise VaecfError("the scorer returned NaN or infinite scores; they cannot be "
                             "ranked")
        return out

    return checked, device


@functools.lru_cache(maxsize=8)
def _chunk_metrics(n_items: int, top_k: int | None) -> ChunkFn:
    """The compiled TensorFlow chunk function, kept so that validating every epoch of a
    training run traces it once."""
    from vaecf.metrics.batched import ChunkMetrics

    return ChunkMetrics(n_items, METRICS, top_k)


def _numpy_chunk(n_items: int, top_k: int | None) -> ChunkFn:
    """The reference as a per-chunk function (dense (B, n_items) arrays on the host)."""
    k = min(max([k for _, _, k in METRICS] + [top_k or 1]), n_items)

    def compute(scores: Any, fold_in: sp.csr_matrix, holdout: sp.csr_matrix
                ) -> dict[str, Any]:
        scores = np.asarray(scores, dtype=np.float32)
        if not np.all(np.isfinite(scores)):
            return {"finite": False}
        top = rank_top_k(scores, fold_in, k)
        out: dict[str, Any] = dict(metrics_from_ranking(top, holdout, METRICS))
        out["finite"] = True
        if top_k is not None:
            top = top[:, :top_k]
            out["top_items"] = top.astype(np.int32)
            out["top_scores"] = np.where(
                top >= 0, np.take_along_axis(scores, np.maximum(top, 0), axis=1), -np.inf
            ).astype(np.float32)
        return out

    return compute
