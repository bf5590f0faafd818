"""EASE in the exported scores (``--ease-blend auto``, the default).

After training, the exported model may rank a user's items by ``export.blend``: its logits
and EASE's scores x_u B (Steck 2019, ``vaecf.baselines.ease``; B from the Gram matrix of the
training users, summed over the ranks' shares), each standardised over the user's items,
EASE's weighted by w. w is chosen on the validation users (``RULE``) with the best epoch's
weights: the highest validation NDCG@100 of ``WEIGHTS``, kept only when its lead over the model
alone is larger than the paired standard error of that lead (as ``vaecf tune`` keeps its
defaults); otherwise the model is exported alone. No training step changes: the blend is a
second, linear item-item path beside the model's (VASP, Vancura and Kordik 2021, trains one
jointly; here it is EASE's closed form).

Why: measured on the development machine (Results, accuracy), ``vaecf train`` without flags
leads both the model alone and EASE on the two real sets: CiteULike-a +0.008 test NDCG@100 over
the model alone (w 0.05 chosen), ML-1M >= 3 +0.024 (w 0.35), where EASE alone beat the model by
0.012.

Where it is off (the reason is logged and recorded): ``--ease-blend off``; ``--shard-items``
(a catalogue beyond one device: B is n_items^2); more than ``EASE_BLEND_MAX_ITEMS`` items; or
a closed form larger than the memory available.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import tensorflow as tf

from vaecf import log
from vaecf.baselines.ease import gram, memory_bytes, needed_bytes, weights_from_gram
from vaecf.metrics import evaluate
from vaecf.metrics.reference import paired_difference
from vaecf.train import horovod as dist
from vaecf.train.config import EASE_BLEND_MAX_ITEMS, TrainConfig
from vaecf.train.export import EaseBlend, ServingModule, blend, ease_scores, ragged_batch
from vaecf.train.tracking import VAL_KEYS

WEIGHTS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.35, 0.5, 0.75, 1.0)
RULE = ("EASE's weight is that of the highest validation NDCG@100 among "
        f"{', '.join(map(str, WEIGHTS))}, kept only when it leads the model alone on the "
        "validation users by more than the paired standard error of that lead")


def why_off(config: TrainConfig, n_items: int) -> str | None:
    """Why this run exports the model without EASE; None when the blend is tried."""
    if config.ease_blend == "off":
        return "--ease-blend off"
    if config.shard_items:
        return "--shard-items: EASE's weights are n_items x n_items on every rank"
    if n_items > EASE_BLEND_MAX_ITEMS:
        return (f"{n_items:,} items: more than {EASE_BLEND_MAX_ITEMS:,} (EASE's weights would "
                f"be {4 * n_items * n_items / 1e9:,.1f} GB of the exported model)")
    if needed_bytes(n_items) > memory_bytes():
        return (f"EASE's closed form of {n_items:,} items needs "
                f"{needed_bytes(n_items) / 1e9:,.1f} GB, more than the memory available")
    return None


def item_gram(train: sp.csr_matrix, runtime: dist.Runtime, summed: bool) -> np.ndarray:
    """float64 (n_items, n_items) X^T X of every training user: of this rank's share, summed
    over the ranks when each holds a share (``summed``), on every rank."""
    partial = gram(train)
    # np.array: Horovod's sum comes back read-only, and EASE's inverse is taken in place
    return np.array(dist.allreduce_sum(partial, runtime)) if summed else partial


def choose(module: ServingModule, item_gram: np.ndarray, l2: float, fold_in: sp.csr_matrix,
           holdout: sp.csr_matrix) -> tuple[EaseBlend | None, dict[str, Any]]:
    """EASE's weight in the exported scores, by ``RULE``, and the record of the choice.

    Args:
      module: the model alone (its ``logits``), the best epoch's weights.
      item_gram: float64 (n_items, n_items) X^T X of the training users (overwritten).
      fold_in, holdout: CSR (validation users, n_items).

    Returns:
      The blend (None: the model alone) and ``{"lambda", "weight", "candidate", "rule",
      "paired", "val_ndcg_at_100" (per weight), "val", "val_stderr"}``, where ``val`` and
      ``val_stderr`` are the exported scores' validation metrics.
    """
    weights = weights_from_gram(item_gram, l2)
    held = tf.constant(weights)
    results = {}
    with log.summarised():  # in a log, the choice's one line below
        for w in (0.0, *WEIGHTS):
            def score(rows: sp.csr_matrix, w: float = w) -> tf.Tensor:
                batch = ragged_batch(tf.constant(rows.indptr, tf.int64),
                                     tf.constant(rows.indices, tf.int64))
                logits = module.logits(batch)
                return logits if w == 0.0 else blend(logits, ease_scores(batch, held), w)

            results[w] = evaluate(score, fold_in, holdout)
    per_user = {w: np.asarray(r.per_user["ndcg_at_100"], np.float64) for w, r in results.items()}
    candidate = max(WEIGHTS, key=lambda w: (float(per_user[w].mean()), -w))
    paired = paired_difference(per_user[candidate], per_user[0.0])
    chosen = candidate if paired["delta"] > paired["stderr"] else 0.0  # type: ignore[operator]
    metrics = results[chosen].metrics
    record = {"lambda": l2, "weight": chosen, "candidate": candidate, "rule": RULE,
              "paired": paired,
              "val_ndcg_at_100": {str(w): float(per_user[w].mean()) for w in results},
              "val": {k: metrics[k].mean for k in VAL_KEYS},
              "val_stderr": {k: metrics[k].stderr for k in VAL_KEYS}}
    log.info(f"EASE in the exported scores: weight {chosen:g} (validation NDCG@100 "
             f"{per_user[chosen].mean():.4f}; the model alone {per_user[0.0].mean():.4f}, "
             f"best weight {candidate:g} leads it by {paired['delta']:+.4f} +- "
             f"{paired['stderr']:.4f})")
    return (EaseBlend(weights, chosen) if chosen else None), record
