"""SavedModel export: the ``score`` and ``recommend`` signatures of contracts.md.

Both take a batch of users as ragged rows: ``row_splits`` (int64 [B+1]) and ``item_idx``
(int64 [nnz]), the users' fold-in items. ``score`` returns the unmasked float32 logits over
the real ``n_items`` (not the padded count); ``recommend`` returns the top ``k`` items that
are not among the user's own, with their scores.

The exported model is a float32 copy of the trained weights, whatever the training precision:
serving and evaluation then do not depend on float16/bfloat16 support of the device.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from vaecf.model import MultVAE, SparseBatch

SIGNATURE_INPUTS = (tf.TensorSpec([None], tf.int64, name="row_splits"),
                    tf.TensorSpec([None], tf.int64, name="item_idx"))


def ragged_batch(row_splits: tf.Tensor, item_idx: tf.Tensor) -> SparseBatch:
    """Users' items given as ragged rows -> a ``SparseBatch`` of ones.

    Sizes come from int32 shapes (host memory on a GPU) and rows from a search of the
    splits: ``tf.ragged.row_splits_to_segment_ids`` takes a ``tf.range`` of a value the GPU
    computes, a wait for the device in every request.
    """
    entries = tf.cast(tf.range(tf.shape(item_idx)[0]), tf.int64)
    rows = tf.searchsorted(row_splits[1:], entries, side="right", out_type=tf.int64)
    users = tf.cast(tf.range(tf.shape(row_splits)[0] - 1), tf.int64)
    return SparseBatch(rows=rows, item_idx=item_idx, values=tf.ones_like(item_idx, tf.float32),
                       user_idx=users)


class _Untracked:
    """Hides the Keras model from SavedModel tracking (Keras would add its own signature)."""

    def __init__(self, model: MultVAE) -> None:
        self.model = model


class ServingModule(tf.Module):
    """What the SavedModel holds: the model's variables and the two signatures."""

    def __init__(self, model: MultVAE) -> None:
        super().__init__()
        self.model_variables = [v.value for v in model.variables]
        self._keras = _Untracked(model)
        self.n_items = model.n_items

    def _scores(self, row_splits: tf.Tensor, item_idx: tf.Tensor) -> tf.Tensor:
        batch = ragged_batch(row_splits, item_idx)
        logits, _, _ = self._keras.model(batch, training=False)
        return logits[:, :self.n_items]

    @tf.function(input_signature=SIGNATURE_INPUTS)
    def score(self, row_splits: tf.Tensor, item_idx: tf.Tensor) -> dict[str, tf.Tensor]:
        """{"scores": float32 [B, n_items]}: unmasked logits."""
        return {"scores": self._scores(row_splits, item_idx)}

    @tf.function(input_signature=(*SIGNATURE_INPUTS, tf.TensorSpec([], tf.int32, name="k")))
    def recommend(self, row_splits: tf.Tensor, item_idx: tf.Tensor,
                  k: tf.Tensor) -> dict[str, tf.Tensor]:
        """{"item_idx": int32 [B, k], "scores": float32 [B, k]}: best items not yet known.

        ``k`` is capped at ``n_items``; a user with fewer than ``k`` unknown items gets
        ``-inf`` scores in the tail (and never one of the user's own items ahead of them).
        """
        scores = self._scores(row_splits, item_idx)
        known = tf.stack([ragged_batch(row_splits, item_idx).rows, item_idx], axis=1)
        masked = tf.tensor_scatter_nd_update(
            scores, known, tf.fill(tf.shape(item_idx), tf.constant(-np.inf, tf.float32)))
        top = tf.math.top_k(masked, k=tf.minimum(k, self.n_items))
        return {"item_idx": top.indices, "scores": top.values}


def export(weights: list[np.ndarray], *, n_items: int, hidden: int, latent: int,
           path: Path) -> None:
    """Write a float32 SavedModel of ``weights`` (in ``MultVAE.weights`` order) to ``path``."""
    model = MultVAE(n_items, hidden=hidden, latent=latent, dropout=0.0, policy="float32")
    model.build_variables()
    model.set_weights(weights)
    module = ServingModule(model)
    tf.saved_model.save(module, str(path),
                        signatures={"score": module.score, "recommend": module.recommend})
