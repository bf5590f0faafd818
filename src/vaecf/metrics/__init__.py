"""Recall@K and NDCG@K: a numpy reference and a batched TensorFlow version.

``evaluate(score_batch, fold_in, holdout, *, batch_users=1024) -> Evaluation`` is the one
entry point used by training (validation), ``vaecf evaluate`` and the benchmark. TensorFlow is
imported only when the batched engine runs.
"""

from vaecf.metrics.evaluation import Evaluation, MetricValue, TopK, evaluate
from vaecf.metrics.reference import METRICS, mean_stderr, ndcg_at_k, rank_top_k, recall_at_k

__all__ = ["METRICS", "Evaluation", "MetricValue", "TopK", "evaluate", "mean_stderr",
           "ndcg_at_k", "rank_top_k", "recall_at_k"]
