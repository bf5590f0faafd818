"""SavedModel export: the ``score``, ``recommend`` and ``recommend_ids`` signatures.

``score`` and ``recommend`` take a batch of users as ragged rows: ``row_splits`` (int64 [B+1])
and ``item_idx`` (int64 [nnz]), the users' fold-in items. ``score`` returns the unmasked
float32 logits over the real ``n_items`` (not the padded count); ``recommend`` returns the top
``k`` items that are not among the user's own, with their scores.

``recommend_ids`` speaks raw ids: the SavedModel carries its item id map (raw id as text ->
item_idx, a ``tf.lookup.StaticHashTable``) and the training popularity of every item, so the
model folder alone answers requests in raw ids through any TensorFlow runtime, TF Serving's
included (whose REST API takes only dense tensors: the users' ids come as a padded string
matrix). The same map is the one ``vaecf recommend`` and ``vaecf serve`` use
(``ServingModule.item_ids``).

The exported model is a float32 copy of the trained weights, whatever the training precision:
serving and evaluation then do not depend on float16/bfloat16 support of the device.

With EASE blended in (``EaseBlend``, chosen by ``vaecf.train.ease_blend``), every signature
ranks by ``blend``: the logits and EASE's scores x_u B, each standardised over the user's
items, EASE's weighted; ``score`` then returns those blended scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from vaecf.model import MultVAE, SparseBatch

SIGNATURE_INPUTS = (tf.TensorSpec([None], tf.int64, name="row_splits"),
                    tf.TensorSpec([None], tf.int64, name="item_idx"))
# Batched ``k`` (one per user): TF Serving's row ("instances") form needs every input batched.
RAW_ID_INPUTS = (tf.TensorSpec([None, None], tf.string, name="items"),
                 tf.TensorSpec([None], tf.int32, name="k"))
PADDING_ID = ""  # pads a user's row of raw ids; never an item id


def ragged_batch(row_splits: tf.Tensor, item_idx: tf.Tensor) -> SparseBatch:
    """Users' items given as ragged rows -> a ``SparseBatch`` of ones.

    Sizes come from int32 shapes (host memory on a GPU) and rows from a search of the
    splits: ``tf.ragged.row_splits_to_segment_ids`` takes a ``tf.range`` of a value the GPU
    computes, a wait for the device in every request.
    """
    entries = tf.cast(tf.range(tf.shape(item_idx)[0]), tf.int64)
    rows = tf.searchsorted(row_splits[1:], entries, side="right", out_type=tf.int64)
    return batch_of_ones(rows, item_idx, tf.shape(row_splits)[0] - 1)


def batch_of_ones(rows: tf.Tensor, item_idx: tf.Tensor, users: tf.Tensor) -> SparseBatch:
    """A ``SparseBatch`` of ones for ``users`` (an int32 count: host memory on a GPU) users."""
    return SparseBatch(rows=rows, item_idx=item_idx, values=tf.ones_like(item_idx, tf.float32),
                       user_idx=tf.cast(tf.range(users), tf.int64))


@dataclass(frozen=True)
class EaseBlend:
    """EASE in the exported scores.

    Attributes:
      weights: float32 (n_items, n_items): EASE's B (zero diagonal), of the training users.
      weight: EASE's weight in ``blend`` (> 0).
    """

    weights: np.ndarray
    weight: float


def standardized(scores: tf.Tensor) -> tf.Tensor:
    """float32 [B, n]: each row less its mean, over its standard deviation (1e-12 added to the
    variance: a constant row becomes zeros), so that two scorers' rows are on one scale."""
    mean, variance = tf.nn.moments(scores, axes=[1], keepdims=True)
    return (scores - mean) * tf.math.rsqrt(variance + 1e-12)


def blend(logits: tf.Tensor, ease: tf.Tensor, weight: float) -> tf.Tensor:
    """float32 [B, n]: ``standardized(logits) + weight * standardized(ease)``."""
    return standardized(logits) + weight * standardized(ease)


def ease_scores(batch: SparseBatch, weights: tf.Tensor) -> tf.Tensor:
    """float32 [users, n_items]: x_u B of each user of ``batch`` (its values as x_u), a
    sparse-dense product: no [users, items] input is densified."""
    shape = tf.stack([tf.shape(batch.user_idx, out_type=tf.int64)[0],
                      tf.shape(weights, out_type=tf.int64)[0]])
    users = tf.sparse.reorder(tf.sparse.SparseTensor(
        tf.stack([batch.rows, batch.item_idx], axis=1), batch.values, shape))
    return tf.sparse.sparse_dense_matmul(users, weights)


class _Untracked:
    """Hides the Keras model from SavedModel tracking (Keras would add its own signature)."""

    def __init__(self, model: MultVAE) -> None:
        self.model = model


class ServingModule(tf.Module):
    """What the SavedModel holds: the model's variables, the item id map and popularity.

    Args:
      item_ids: (n_items,) raw id of each item_idx, written as text.
      popularity: (n_items,) training users per item: the ranking of a user with no known item.
      ease: EASE blended into the scores, or None (the logits alone).
    """

    def __init__(self, model: MultVAE, item_ids: np.ndarray, popularity: np.ndarray,
                 ease: EaseBlend | None = None) -> None:
        super().__init__()
        self.ease = None if ease is None else tf.Variable(ease.weights, trainable=False,
                                                          name="ease_weights")
        self.ease_weight = 0.0 if ease is None else float(ease.weight)
        self.model_variables = [v.value for v in model.variables]
        self._keras = _Untracked(model)
        self.n_items = model.n_items
        self.item_ids = tf.Variable(item_ids, trainable=False, name="item_ids")
        self.popularity = tf.Variable(popularity.astype(np.float32), trainable=False,
                                      name="popularity")
        self.id_table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(item_ids), tf.range(self.n_items, dtype=tf.int64)), default_value=-1)

    def logits(self, batch: SparseBatch) -> tf.Tensor:
        """float32 [users, n_items]: the model's logits (the mean of the latent code)."""
        logits, _, _ = self._keras.model(batch, training=False)
        return logits[:, :self.n_items]

    def _scores(self, batch: SparseBatch) -> tf.Tensor:
        if self.ease is None:
            return self.logits(batch)
        return blend(self.logits(batch), ease_scores(batch, self.ease), self.ease_weight)

    @tf.function(input_signature=SIGNATURE_INPUTS)
    def score(self, row_splits: tf.Tensor, item_idx: tf.Tensor) -> dict[str, tf.Tensor]:
        """{"scores": float32 [B, n_items]}: unmasked logits (blended with EASE's scores
        when the model has EASE)."""
        return {"scores": self._scores(ragged_batch(row_splits, item_idx))}

    @tf.function(input_signature=(*SIGNATURE_INPUTS, tf.TensorSpec([], tf.int32, name="k")))
    def recommend(self, row_splits: tf.Tensor, item_idx: tf.Tensor,
                  k: tf.Tensor) -> dict[str, tf.Tensor]:
        """{"item_idx": int32 [B, k], "scores": float32 [B, k]}: best items not yet known.

        ``k`` is capped at ``n_items``; a user with fewer than ``k`` unknown items gets
        ``-inf`` scores in the tail (and never one of the user's own items ahead of them).
        """
        batch = ragged_batch(row_splits, item_idx)
        scores = self._scores(batch)
        known = tf.stack([batch.rows, item_idx], axis=1)
        masked = tf.tensor_scatter_nd_update(
            scores, known, tf.fill(tf.shape(item_idx), tf.constant(-np.inf, tf.float32)))
        top = tf.math.top_k(masked, k=tf.minimum(k, self.n_items))
        return {"item_idx": top.indices, "scores": top.values}

    @tf.function(input_signature=RAW_ID_INPUTS)
    def recommend_ids(self, items: tf.Tensor, k: tf.Tensor) -> dict[str, tf.Tensor]:
        """Top-k raw ids for users given by raw ids; one model call for the whole batch.

        Args:
          items: string [B, L], each user's item ids, right-padded with "".
          k: int32 [B], items wanted per user (capped at ``n_items``).

        Returns:
          ``item_id`` string [B, K] and ``scores`` float32 [B, K] with K = max(k): the best
          items not among the user's own; a user's slots past its own k (or past its unknown
          items) hold "" and -inf. ``unknown`` int32 [B]: ids the model does not know (ignored).
          ``fallback`` bool [B]: no known item, so the ranking is the training popularity
          (scores are then training users per item).
        """
        # Strings have no GPU kernels: the id lookup, the string comparison and the gather of
        # raw ids run on the host by design (they read the request and write the response);
        # only item_idx crosses to the device and the top item_idx back.
        with tf.device("/CPU:0"):
            idx = self.id_table.lookup(items)
            unknown = tf.reduce_sum(tf.cast((idx < 0) & (items != PADDING_ID), tf.int32), axis=1)
        own = self._multi_hot(idx)
        unique = tf.where(own)  # (user, item_idx) pairs, each once, sorted
        scores = self._scores(batch_of_ones(unique[:, 0], unique[:, 1], tf.shape(idx)[0]))
        fallback = ~tf.reduce_any(own, axis=1)
        scores = tf.where(fallback[:, None], self.popularity[None, :], scores)
        masked = tf.where(own, tf.constant(-np.inf, tf.float32), scores)
        k = tf.minimum(k, self.n_items)
        k_max = tf.reduce_max(tf.concat([k, [0]], axis=0))
        top = tf.math.top_k(masked, k=k_max)
        wanted = (tf.range(k_max)[None, :] < k[:, None]) & tf.math.is_finite(top.values)
        with tf.device("/CPU:0"):  # strings: see above
            item_id = tf.where(wanted, tf.gather(self.item_ids, top.indices), PADDING_ID)
        return {"item_id": item_id,
                "scores": tf.where(wanted, top.values, tf.constant(-np.inf, tf.float32)),
                "unknown": unknown, "fallback": fallback}

    def _multi_hot(self, idx: tf.Tensor) -> tf.Tensor:
        """bool [B, n_items]: the items of each row of ``idx`` (item_idx, -1 for none).

        A float scatter into zeros whose size is the int32 shape (host memory on a GPU):
        an int32 ``scatter_nd`` or a shape computed in int64 would be read by the host.
        Duplicates write the same 1, so they count once.
        """
        where = tf.where(idx >= 0)  # [nnz, 2]: (user, position)
        pairs = tf.stack([where[:, 0], tf.gather_nd(idx, where)], axis=1)
        zeros = tf.zeros([tf.shape(idx)[0], self.n_items], tf.float32)
        return tf.tensor_scatter_nd_update(zeros, pairs, tf.ones_like(pairs[:, 0], tf.float32)) > 0


def item_id_text(item_ids: np.ndarray) -> np.ndarray:
    """Raw ids as the text the SavedModel matches: ``4`` for an integer id, never ``4.0``."""
    return np.array([str(int(i)) if isinstance(i, (int, np.integer)) else str(i)
                     for i in item_ids.tolist()], dtype=object)


def serving_module(weights: list[np.ndarray], *, n_items: int, hidden: int, latent: int,
                   item_ids: np.ndarray, popularity: np.ndarray, encoder_layers: int = 1,
                   ease: EaseBlend | None = None) -> ServingModule:
    """The ``ServingModule`` of ``weights`` (in ``MultVAE.weights`` order, without a composite
    prior's frozen encoder), a float32 copy.

    Args:
      encoder_layers: the encoder's depth (``MultVAE``); the signatures are the same.
      item_ids: (n_items,) raw id of each item_idx (the split's ``item_index.parquet``).
      popularity: (n_items,) training users per item (``Popularity(train).counts`` of the
        whole training matrix, summed over the ranks' shares): the fallback ranking.
      ease: EASE blended into the scores, or None.
    """
    text = item_id_text(np.asarray(item_ids))
    if text.size != n_items or len(set(text)) != n_items:
        raise ValueError(f"item ids: expected {n_items} distinct ids, got {text.size} "
                         f"({len(set(text))} distinct)")
    model = MultVAE(n_items, hidden=hidden, latent=latent, dropout=0.0, policy="float32",
                    encoder_layers=encoder_layers)
    model.build_variables()
    model.set_weights(weights)
    return ServingModule(model, np.array([t.encode() for t in text], dtype=object),
                         np.asarray(popularity, np.float32), ease)


def save(module: ServingModule, path: Path) -> None:
    """Write ``module`` as a SavedModel at ``path``, its signatures named."""
    tf.saved_model.save(module, str(path),
                        # serving_default: what TF Serving answers when no signature is named
                        signatures={"score": module.score, "recommend": module.recommend,
                                    "recommend_ids": module.recommend_ids,
                                    "serving_default": module.recommend_ids})


def export(weights: list[np.ndarray], *, path: Path, **module: Any) -> None:
    """Write the float32 SavedModel of ``weights`` to ``path`` (``serving_module``'s
    arguments)."""
    save(serving_module(weights, **module), path)
