"""The learning rate for a global batch: one rule shared by the benchmark and the MPIJob.

``vaecf train``'s learning rate (5e-4 with its width 1200; Liang et al. 2018 tuned 1e-3 for
width 600) is for 500 users per step on one device. Spreading training over R ranks at B users
per rank makes the global batch R x B, so each epoch has R x B / 500 times fewer steps; the
learning rate grows with the global batch to keep the epochs to a target NDCG from growing as
much::

    none     lr = base_lr
    sqrt     lr = base_lr * sqrt(global_batch / BASE_BATCH)
    linear   lr = base_lr * global_batch / BASE_BATCH

Which rule reaches a validation NDCG@100 target first is measured by ``vaecf benchmark
--lr-scaling ... --target-ndcg``; README's multi-GPU section gives the figures.
"""

from __future__ import annotations

import math

from vaecf.train.config import DEFAULT_BATCH_SIZE, TrainConfig

LR_RULES = ("none", "sqrt", "linear")
# vaecf train's defaults: its learning rate at its users per step (one device)
BASE_BATCH, BASE_LEARNING_RATE = DEFAULT_BATCH_SIZE, TrainConfig.learning_rate


def scaled_learning_rate(global_batch: int, rule: str,
                         base_lr: float = BASE_LEARNING_RATE) -> float:
    """``base_lr`` scaled by ``rule`` from ``BASE_BATCH`` to ``global_batch`` users per step.

    Raises:
      ValueError: an unknown rule or a batch below 1.
    """
    if rule not in LR_RULES:
        raise ValueError(f"unknown learning-rate scaling {rule!r} (one of: "
                         f"{', '.join(LR_RULES)})")
    if global_batch < 1:
        raise ValueError(f"global batch must be >= 1, got {global_batch}")
    ratio = global_batch / BASE_BATCH
    factor = {"none": 1.0, "sqrt": math.sqrt(ratio), "linear": ratio}[rule]
    return float(f"{base_lr * factor:.6g}")  # a short decimal in the command line
