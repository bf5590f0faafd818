"""Counter-based randomness for dropout and the reparameterisation trick.

Every random number of a training step is a hash of ``(seed, step, user_idx, key)``, not a
draw from a stateful generator. Why: the noise a user sees then does not depend on how the
global batch was split across Horovod ranks, so ``horovodrun -np 2`` with global batch B
computes exactly what one process with batch B computes, and a resumed run needs only the
seed and the step to continue the same random stream (nothing hidden to checkpoint).

The hash is a 32-bit integer mixer (xor-shift-multiply rounds) evaluated in int64 so that
products never overflow; it runs inside XLA and on every device.
"""

from __future__ import annotations

import math

import tensorflow as tf

_MASK = 0xFFFFFFFF
_MULTIPLIER = 0x45D9F3B  # < 2**27, so (x < 2**32) * multiplier < 2**59 fits in int64

STREAM_DROPOUT = 1
STREAM_EPSILON = 2
STREAM_INIT = 3
_INIT_BLOCK = 1 << 22  # elements hashed at once by ``item_uniform``


def _mix(x: tf.Tensor) -> tf.Tensor:
    """Mix the low 32 bits of int64 ``x`` into a uniformly spread 32-bit value."""
    x = tf.bitwise.bitwise_and(x, _MASK)
    for _ in range(2):
        x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))
        x = tf.bitwise.bitwise_and(x * _MULTIPLIER, _MASK)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))


def hash_keys(*keys: tf.Tensor | int) -> tf.Tensor:
    """Chain-hash broadcastable int64 keys into one 32-bit value per element (int64).

    Scalar keys (seed, stream, step) contribute all 64 bits; array keys (user and item
    indices, below 2**32) only their low 32 bits, which halves the per-element work.
    """
    state = tf.constant(0x9E3779B9, tf.int64)
    for key in keys:
        key = tf.cast(key, tf.int64)
        state = _mix(tf.bitwise.bitwise_xor(state, tf.bitwise.bitwise_and(key, _MASK)))
        if key.shape.rank == 0:
            state = _mix(tf.bitwise.bitwise_xor(state, tf.bitwise.right_shift(key, 32)))
    return state


def uniform(*keys: tf.Tensor | int) -> tf.Tensor:
    """Uniform float32 in the open interval (0, 1), one per broadcast element of ``keys``."""
    bits = tf.bitwise.right_shift(hash_keys(*keys), 8)  # 24 bits: exact in float32
    return (tf.cast(bits, tf.float32) + 0.5) * (1.0 / (1 << 24))


def normal(seed: tf.Tensor | int, step: tf.Tensor, user_idx: tf.Tensor, dims: int) -> tf.Tensor:
    """Standard normal noise of shape [users, dims] by the Box-Muller transform.

    Args:
      user_idx: int64 [users], global user indices (the noise is a function of the user).
    """
    column = tf.range(2 * dims, dtype=tf.int64)[tf.newaxis, :]
    users = tf.cast(user_idx, tf.int64)[:, tf.newaxis]
    # One hash over [users, 2 * dims] (u1 at even columns, u2 at odd): half the kernel
    # launches of two hashes over [users, dims], the same numbers.
    both = uniform(seed, STREAM_EPSILON, step, users, column)
    u1, u2 = both[:, 0::2], both[:, 1::2]
    return tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos(2.0 * math.pi * u2)


def item_uniform(seed: int, key: int, first: int, shape: tuple[int, ...],
                 item_axis: int) -> tf.Tensor:
    """Uniform float32 of ``shape`` (1-D, or 2-D with items on ``item_axis``), one per
    (seed, key, global item index, unit): a shard of a layer's items (``first`` its first
    item) gets exactly the whole layer's slice. Hashed in blocks of items, so the int64
    work never holds more than ``_INIT_BLOCK`` elements.
    """
    items = shape[item_axis]
    units = 1 if len(shape) == 1 else shape[1 - item_axis]
    per_block = max(1, _INIT_BLOCK // units)
    unit = tf.range(units, dtype=tf.int64)
    parts = []
    for start in range(0, items, per_block):
        item = tf.range(first + start, first + min(items, start + per_block), dtype=tf.int64)
        if len(shape) == 1:
            parts.append(uniform(seed, STREAM_INIT, key, item))
        elif item_axis == 0:
            parts.append(uniform(seed, STREAM_INIT, key, item[:, tf.newaxis], unit))
        else:
            parts.append(uniform(seed, STREAM_INIT, key, item, unit[:, tf.newaxis]))
    if not parts:
        return tf.zeros(shape, tf.float32)
    return parts[0] if len(parts) == 1 else tf.concat(parts, axis=item_axis)
