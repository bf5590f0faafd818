"""The Mult-VAE objective: multinomial log-likelihood, KL divergence, beta annealing.

All in float32, whatever the compute policy: a log-softmax over 20,000 items in bfloat16
loses the differences between logits that rank the items.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from vaecf.model.vae import SparseBatch


def multinomial_nll(logits: tf.Tensor, batch: SparseBatch) -> tf.Tensor:
    """Per-user multinomial negative log-likelihood, float32 [users].

    ``-sum_i x_ui log softmax(logits_u)_i = (sum_i x_ui) * logsumexp(logits_u) -
    sum_i x_ui logits_ui``: the log-softmax is read only at the user's items plus one
    log-sum-exp per user. The gradient is written by hand, ``count_u * softmax_u - x_u``,
    from the softmax kept by the forward pass: a few passes over the [users, items] array
    instead of the dozen automatic differentiation makes.

    Args:
      logits: [users, items] in any float dtype (upcast to float32 here).
      batch: the users' items; padding entries have value 0 and contribute nothing.
    """
    return _nll(logits, batch.rows, batch.item_idx, batch.values)


@tf.custom_gradient
def _nll(logits: tf.Tensor, rows: tf.Tensor, item_idx: tf.Tensor,
         values: tf.Tensor) -> tuple[tf.Tensor, Callable[[tf.Tensor], tuple]]:
    users = tf.shape(logits)[0]
    z = tf.cast(logits, tf.float32)
    # One fused (oneDNN) softmax pass; the log-sum-exp follows from the largest probability,
    # which sits at the largest logit: lse = max(z) - log(max(softmax(z))).
    probabilities = tf.nn.softmax(z)
    lse = tf.reduce_max(z, axis=1) - tf.math.log(tf.reduce_max(probabilities, axis=1))
    index = tf.stack([rows, item_idx], axis=1)
    segments = tf.cast(rows, tf.int32)
    dot = tf.math.unsorted_segment_sum(tf.gather_nd(z, index) * values, segments, users)
    count = tf.math.unsorted_segment_sum(values, segments, users)

    def grad(upstream: tf.Tensor) -> tuple[tf.Tensor, None, None, None]:
        dz = probabilities * (upstream * count)[:, tf.newaxis]
        # The scatter stays float32 (cast after it): tensor_scatter_nd_* in float16/bfloat16 is
        # ~10x slower on an H100 (DESIGN.md section 8).
        dz = tf.tensor_scatter_nd_sub(dz, index, tf.gather(upstream, rows) * values)
        return tf.cast(dz, logits.dtype), None, None, None

    return count * lse - dot, grad


def gaussian_kl(mu: tf.Tensor, logvar: tf.Tensor) -> tf.Tensor:
    """Per-user KL(N(mu, exp(logvar)) || N(0, I)) = 0.5 sum(exp(lv) + mu^2 - 1 - lv), [users]."""
    return 0.5 * tf.reduce_sum(tf.exp(logvar) + tf.square(mu) - 1.0 - logvar, axis=1)


def beta_at(step: tf.Tensor | int, cap: float, anneal_steps: int) -> tf.Tensor:
    """KL weight after ``step`` updates: ``min(cap, step / anneal_steps)`` (paper: 0.2, 200k).

    ``anneal_steps`` = 0 means no annealing: beta is the cap from the first step.
    """
    if anneal_steps <= 0:
        return tf.constant(cap, tf.float32)
    return tf.minimum(tf.constant(cap, tf.float32),
                      tf.cast(step, tf.float32) / float(anneal_steps))


def l2_penalty(kernels: list[tf.Tensor], l2: float) -> tf.Tensor:
    """``l2 * sum ||W||^2`` over the kernels (the paper's ``2 * l2_regularizer(lam)``)."""
    if l2 == 0.0:
        return tf.constant(0.0, tf.float32)
    return l2 * tf.add_n([tf.reduce_sum(tf.square(k)) for k in kernels])
