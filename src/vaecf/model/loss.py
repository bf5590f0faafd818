"""The Mult-VAE objective: multinomial log-likelihood, KL divergence, beta annealing.

All in float32, whatever the compute policy: a log-softmax over 20,000 items in bfloat16
loses the differences between logits that rank the items. ``chunked_nll`` computes the same
likelihood without holding the [users, items] logits (millions of items).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import tensorflow as tf

from vaecf.model.batch import SparseBatch


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


def chunked_nll(hidden: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor, batch: SparseBatch,
                chunk: int) -> tf.Tensor:
    """``multinomial_nll(hidden @ kernel + bias, batch)`` without the [users, items] logits.

    The log-sum-exp is accumulated over item chunks (a running max and sum of exp, as in
    Cut Cross-Entropy, Wijmans et al. 2025) and the user's own items are read in the chunk
    where they fall, so the forward pass holds [users, chunk] logits at a time. The backward
    pass recomputes each chunk's logits from ``hidden`` and the saved log-sum-exp: peak
    activation memory is O(users x chunk) both ways, for a second decoder matmul.

    Args:
      hidden: [users, hidden], the decoder's last activations (compute dtype).
      kernel: [hidden, items], the decoder kernel (compute dtype).
      bias: float32 [items]; padded items hold the float32 minimum (no mass, no gradient).
      batch: the users' items.
      chunk: items per chunk.
    """
    return _chunked_nll(hidden, kernel, bias, Entries.of(batch), chunk=chunk)


class Entries(NamedTuple):
    """A batch's entries as the chunked loss reads them (item indices local to a kernel)."""

    rows: tf.Tensor  # int32 [nnz]
    items: tf.Tensor  # int64 [nnz], index into the kernel's columns (any value: not there)
    values: tf.Tensor  # float32 [nnz]

    @staticmethod
    def of(batch: SparseBatch, first_item: int | tf.Tensor = 0) -> Entries:
        """``batch``'s entries for a kernel whose column 0 is item ``first_item``."""
        return Entries(tf.cast(batch.rows, tf.int32), batch.item_idx - first_item,
                       batch.values)


def _in_chunk(entries: Entries, start: tf.Tensor, size: int) -> tuple[tf.Tensor, tf.Tensor]:
    """(int [nnz, 2] (row, column in the chunk) clipped into it, float32 [nnz] weight:
    the entry's value where its item falls in the chunk, else 0)."""
    column = entries.items - tf.cast(start, tf.int64)
    inside = (column >= 0) & (column < size)
    index = tf.stack([entries.rows, tf.cast(tf.clip_by_value(column, 0, size - 1), tf.int32)], 1)
    return index, tf.where(inside, entries.values, 0.0)


def _chunk_logits(hidden: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor, start: tf.Tensor,
                  size: int) -> tf.Tensor:
    """float32 [users, size]: the logits of the kernel's columns ``start .. start + size``."""
    columns = tf.slice(kernel, tf.stack([0, start]), [-1, size])
    return tf.cast(tf.matmul(hidden, columns), tf.float32) + tf.slice(bias, [start], [size])


def _over_chunks(n_items: int, chunk: int, body: Callable[..., tuple], state: tuple,
                 outputs: tuple[tuple[tf.DType, tuple[int, ...]], ...] = ()) -> tuple:
    """Runs ``body(start, size, *state) -> (*state, *outputs)`` over the chunks of ``n_items``
    in order; returns the last state and each output concatenated over the chunks.

    The full chunks run in a ``tf.while_loop`` (one graph node whatever the item count, one
    chunk alive at a time) and the remainder in one more call, so every slice and every
    output has a static shape (XLA compiles it).

    Args:
      outputs: (dtype, shape after the item axis) of each per-chunk output.
    """
    full, rest = divmod(n_items, chunk)
    arrays = tuple(tf.TensorArray(dtype, size=full, element_shape=(chunk, *shape))
                   for dtype, shape in outputs)
    if full:
        def loop(i: tf.Tensor, *carried: Any) -> tuple:
            result = body(i * chunk, chunk, *carried[:len(state)])
            written = [a.write(i, x) for a, x in
                       zip(carried[len(state):], result[len(state):], strict=True)]
            return (i + 1, *result[:len(state)], *written)

        looped = tf.while_loop(lambda i, *_: i < full, loop, (tf.constant(0), *state, *arrays),
                               parallel_iterations=1)[1:]
        state, arrays = tuple(looped[:len(state)]), tuple(looped[len(state):])
    parts: list[list[tf.Tensor]] = [[a.concat()] if full else [] for a in arrays]
    if rest:
        result = body(tf.constant(full * chunk), rest, *state)
        state = tuple(result[:len(state)])
        for part, x in zip(parts, result[len(state):], strict=True):
            part.append(x)
    return (*state, *(p[0] if len(p) == 1 else tf.concat(p, 0) for p in parts))


def chunked_statistics(hidden: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor,
                       entries: Entries, chunk: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """float32 [users] each, over the kernel's items by chunk: the largest logit, the sum of
    exp(logit - largest) and ``sum_i x_ui z_ui`` over the user's items among them.

    Returned apart so that item shards can combine theirs.
    """
    def step(start: tf.Tensor, size: int, top: tf.Tensor, total: tf.Tensor,
             dot: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        z = _chunk_logits(hidden, kernel, bias, start, size)
        new_top = tf.maximum(top, tf.reduce_max(z, axis=1))
        total = total * tf.exp(top - new_top) + tf.reduce_sum(
            tf.exp(z - new_top[:, tf.newaxis]), axis=1)
        index, weight = _in_chunk(entries, start, size)
        dot += tf.math.unsorted_segment_sum(tf.gather_nd(z, index) * weight, entries.rows,
                                            users)
        return new_top, total, dot

    users = tf.shape(hidden)[0]
    zeros = tf.zeros([users], tf.float32)
    return _over_chunks(int(kernel.shape[1]), chunk, step,
                        (tf.fill([users], tf.float32.min), zeros, zeros))


def chunked_gradients(hidden: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor, lse: tf.Tensor,
                      scale: tf.Tensor, entries: Entries, upstream: tf.Tensor,
                      chunk: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Gradients of ``sum_u upstream_u (scale_u lse_u - sum_i x_ui z_ui)`` w.r.t. (hidden,
    kernel, bias), by chunk: ``dz_ui = scale_u softmax_ui - upstream_u x_ui``, the softmax
    recomputed per chunk as ``exp(z_ui - lse_u)``.

    Returns [users, hidden] and [hidden, items] in the compute dtype, float32 [items].
    """
    def step(start: tf.Tensor, size: int, d_hidden: tf.Tensor) -> tuple:
        z = _chunk_logits(hidden, kernel, bias, start, size)
        index, weight = _in_chunk(entries, start, size)
        # float32 scatter, cast after it (~10x faster than float16 on an H100, section 8).
        dz = tf.tensor_scatter_nd_sub(tf.exp(z - lse[:, tf.newaxis]) * scale[:, tf.newaxis],
                                      index, tf.gather(upstream, entries.rows) * weight)
        columns = tf.slice(kernel, tf.stack([0, start]), [-1, size])
        dz_compute = tf.cast(dz, hidden.dtype)
        d_hidden += tf.cast(tf.matmul(dz_compute, columns, transpose_b=True), tf.float32)
        return (d_hidden, tf.matmul(dz_compute, hidden, transpose_a=True),
                tf.reduce_sum(dz, axis=0))

    width = int(kernel.shape[0])
    d_hidden, d_kernel, d_bias = _over_chunks(
        int(kernel.shape[1]), chunk, step, (tf.zeros(tf.shape(hidden), tf.float32),),
        outputs=((hidden.dtype, (width,)), (tf.float32, ())))
    # The chunks are [chunk, hidden] (outputs concatenate on axis 0): one transpose.
    return tf.cast(d_hidden, hidden.dtype), tf.transpose(d_kernel), d_bias


def _chunked_nll(hidden: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor, entries: Entries, *,
                 chunk: int) -> tf.Tensor:
    @tf.custom_gradient
    def nll(hidden: tf.Tensor, kernel: tf.Tensor,
            bias: tf.Tensor) -> tuple[tf.Tensor, Callable[[tf.Tensor], tuple]]:
        top, total, dot = chunked_statistics(hidden, kernel, bias, entries, chunk)
        lse = top + tf.math.log(total)
        count = tf.math.unsorted_segment_sum(entries.values, entries.rows, tf.shape(hidden)[0])

        def grad(upstream: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            return chunked_gradients(hidden, kernel, bias, lse, upstream * count, entries,
                                     upstream, chunk)

        return count * lse - dot, grad

    return nll(hidden, kernel, bias)


def gaussian_kl(mu: tf.Tensor, logvar: tf.Tensor) -> tf.Tensor:
    """Per-user KL(N(mu, exp(logvar)) || N(0, I)) = 0.5 sum(exp(lv) + mu^2 - 1 - lv), [users]."""
    return 0.5 * tf.reduce_sum(tf.exp(logvar) + tf.square(mu) - 1.0 - logvar, axis=1)


# RecVAE's composite prior: mixture weights of N(0, I), the previous posterior and a wide
# normal, and the wide normal's log-variance (Shenbin et al., WSDM 2020, and their code).
PRIOR_WEIGHTS = (3 / 20, 3 / 4, 1 / 10)
WIDE_LOGVAR = 10.0


def _log_normal(z: tf.Tensor, mu: tf.Tensor | float, logvar: tf.Tensor | float) -> tf.Tensor:
    """Elementwise log N(z; mu, exp(logvar))."""
    return -0.5 * (logvar + math.log(2.0 * math.pi) + tf.square(z - mu) * tf.exp(-logvar))


def composite_kl(z: tf.Tensor, mu: tf.Tensor, logvar: tf.Tensor, old_mu: tf.Tensor,
                 old_logvar: tf.Tensor) -> tf.Tensor:
    """Per-user one-sample KL estimate against the composite prior, float32 [users].

    ``sum_d log N(z_d; mu_d, e^lv_d) - log(w0 N(z_d; 0, 1) + w1 N(z_d; old_mu_d, e^old_lv_d)
    + w2 N(z_d; 0, e^10))``, the mixture per latent dimension (``PRIOR_WEIGHTS``).

    Args:
      z: [users, latent], the sampled code; mu, logvar: its posterior's statistics.
      old_mu, old_logvar: [users, latent], the previous posterior (no gradient).
    """
    components = [_log_normal(z, 0.0, 0.0), _log_normal(z, old_mu, old_logvar),
                  _log_normal(z, 0.0, WIDE_LOGVAR)]
    prior = tf.reduce_logsumexp(tf.stack([c + math.log(w) for c, w in
                                          zip(components, PRIOR_WEIGHTS, strict=True)], -1), -1)
    return tf.reduce_sum(_log_normal(z, mu, logvar) - prior, axis=1)


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
