"""The layers of Mult-VAE (``vaecf.model.vae``): the sparse first layer in its three forms,
the dense layers, the item logits, and the paper's initialisation, drawn per item for the
item-sized weights so that an item shard starts as the whole layer's slice."""

from __future__ import annotations

import math
from typing import NamedTuple

import keras
import tensorflow as tf

from vaecf.model import loss, noise
from vaecf.model import shard as item_shard
from vaecf.model.batch import SparseBatch


def add_bias(x: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    """``x + bias`` over the last axis, written per dtype for speed.

    float32: ``tf.nn.bias_add``, which oneDNN fuses with the preceding matmul on CPU.
    float16/bfloat16: a plain "+": TensorFlow's half-precision BiasAddGrad is a naive GPU kernel
    that took 67% of an H100's step under mixed_float16 (150k -> 357k users/s with "+",
    DESIGN.md section 8).
    """
    return tf.nn.bias_add(x, bias) if x.dtype == tf.float32 else x + bias


def _initializers(seed: int, layer: int) -> dict[str, keras.initializers.Initializer]:
    """Paper initialisation, seeded per layer so every Horovod rank starts identical.

    Layers 0-3 are Mult-VAE's (their seeds as ever); the deep encoder's (4 and up) draw from
    a range of seeds no (seed, layer < 4) pair reaches.
    """
    base = seed * 8 + 2 * layer if layer < 4 else (1 << 30) + seed * 256 + 2 * layer
    return {"kernel_initializer": keras.initializers.GlorotUniform(seed=base),
            "bias_initializer": keras.initializers.TruncatedNormal(stddev=0.001,
                                                                   seed=base + 1)}


class ItemRange(NamedTuple):
    """The items an item-sized layer holds: ``held`` from global index ``first``, of
    ``total`` padded items (the whole layer's: Glorot's fans)."""

    first: int
    held: int
    total: int


class ItemDraw(keras.initializers.Initializer):
    """The paper's initialisation of an item-sized weight, each value a function of (seed,
    weight, global item, unit) (``noise.item_uniform``): an item shard starts from exactly
    the whole layer's slice, so ``--shard-items`` trains the model one process trains.

    Args:
      limit: Glorot's uniform bound; None: truncated normal, standard deviation 0.001 cut
        at two (as ``keras.initializers.TruncatedNormal``), by the inverse CDF.
    """

    def __init__(self, seed: int, key: int, first: int, item_axis: int,
                 limit: float | None) -> None:
        self.seed, self.key, self.first = seed, key, first
        self.item_axis, self.limit = item_axis, limit

    def __call__(self, shape: tuple[int, ...], dtype: object = None) -> tf.Tensor:
        u = 2.0 * noise.item_uniform(self.seed, self.key, self.first, tuple(shape),
                                     self.item_axis) - 1.0
        if self.limit is not None:
            return self.limit * u
        return 0.001 * math.sqrt(2.0) * tf.math.erfinv(u * math.erf(math.sqrt(2.0)))

    def get_config(self) -> dict[str, object]:
        return {"seed": self.seed, "key": self.key, "first": self.first,
                "item_axis": self.item_axis, "limit": self.limit}


def _glorot_limit(fan_in: int, fan_out: int) -> float:
    return math.sqrt(6.0 / (fan_in + fan_out))


FIRST_LAYER_FORMS = ("halves", "dense", "segment")


def first_layer_form(xla: bool) -> str:
    """How ``SparseDense`` multiplies on this host (STYLE 13: the reasons are at its forms).

    "segment" under ``--xla`` (XLA has no sparse product kernel), "dense" where a GPU is
    visible, else "halves" (the CPU's sparse product).
    """
    if xla:
        return "segment"
    return "dense" if tf.config.list_logical_devices("GPU") else "halves"


class SparseDense(keras.layers.Layer):
    """``tanh(x @ kernel + bias)`` for a sparse ``x``; always float32 (it is cheap).

    Three forms of one product, equal up to float32 rounding (tested, values and gradients):

    - "halves": two ``SparseTensorDenseMatMul`` s over halves of the entries. CPU: TF's
      sparse product is single-threaded; two independent halves run in parallel (forward
      and gradient), measured faster on 2 cores. On a GPU it is an atomicAdd per (entry,
      column), 30% of an H100 step's kernel time at batch 16384, raises under op determinism
      (tensorflow#56547) and refuses output width x entries > 2^31: hence "dense" there.
    - "dense": the batch scattered into float32 [users, items] on the device, then one
      matmul (its gradient a second one): a scatter of nnz values instead of nnz x units
      atomics, no size limit, and TF 2.17's GPU build names no determinism exception for
      ScatterNd or MatMul (it does for SparseTensorDenseMatMul);
      2 x 395 GFLOP at batch 16384 is ~2 ms at an H100's TF32 rate against ~10 ms of SpMM.
    - "segment": a gather of kernel rows and a segment sum, which XLA compiles (``--xla``
      compiles the whole step).

    Args:
      form: one of ``FIRST_LAYER_FORMS`` (``first_layer_form`` picks it for the host).
      activation: "tanh" (Mult-VAE) or "silu" (swish: the deep encoder's first layer).
    """

    def __init__(self, items: ItemRange, units: int, seed: int, form: str = "halves",
                 activation: str = "tanh", **kwargs: object) -> None:
        super().__init__(dtype="float32", **kwargs)
        if form not in FIRST_LAYER_FORMS:
            raise ValueError(f"first layer form {form!r}: expected one of {FIRST_LAYER_FORMS}")
        self.form = form
        self.activation = keras.activations.get(activation)
        limit = _glorot_limit(items.total, units)
        self.kernel = self.add_weight(shape=(items.held, units), name="kernel",
                                      initializer=ItemDraw(seed, 0, items.first, 0, limit))
        self.bias = self.add_weight(shape=(units,), name="bias",
                                    initializer=_initializers(seed, 0)["bias_initializer"])

    def sharded(self, entries: loss.Entries, users: tf.Tensor,
                shard: item_shard.ItemShard) -> tf.Tensor:
        """The layer's output [users, hidden] when its rows are sharded by item."""
        product = item_shard.first_layer(entries, self.kernel.value, users, shard)
        return self.activation(product + self.bias.value)

    def shared(self, batch: SparseBatch, values: tf.Tensor, users: tf.Tensor,
               shard: item_shard.ItemShard) -> tf.Tensor:
        """The layer's output [users, hidden] of a batch every rank holds alike, its rows
        sharded by item."""
        entries = loss.Entries.of(batch, shard.first)._replace(values=values)
        product = item_shard.shared_first_layer(entries, self.kernel.value, users, shard)
        return self.activation(product + self.bias.value)

    def global_batch(self, entries: loss.Entries, users: tf.Tensor,
                     shard: item_shard.ItemShard) -> tf.Tensor:
        """This rank's users' output [users, hidden] from the global batch's ``entries``
        (``item_shard.global_entries``), without a gradient: the frozen copy of the encoder
        (``--composite-prior``) under ``--shard-items``."""
        product = item_shard.shared_first_layer(entries, self.kernel.value, users * shard.size,
                                                shard)
        return self.activation(shard.own(product, users) + self.bias.value)

    def call(self, batch: SparseBatch, values: tf.Tensor, users: tf.Tensor) -> tf.Tensor:
        """[users, units] from ``batch``'s entries weighted by ``values`` (float32 [nnz]).

        ``users`` is an int32 scalar: shape arithmetic in int32 stays in host memory on a GPU
        (where the shape arguments of ScatterNd and segment sums are read), int64 would be
        computed on the device and copied back, a wait for the device mid-step.
        """
        kernel = self.kernel.value
        if self.form == "segment":
            # float32 gather and segment sum: their scatter gradient in float16/bfloat16 is
            # ~10x slower on an H100 (DESIGN.md section 8), and XLA compiles both.
            picked = tf.gather(kernel, batch.item_idx) * values[:, tf.newaxis]
            product = tf.math.unsorted_segment_sum(picked, batch.rows, users)
        elif self.form == "dense":  # duplicate (padding) entries have value 0: sums are exact
            index = tf.cast(tf.stack([batch.rows, batch.item_idx], axis=1), tf.int32)
            dense = tf.scatter_nd(index, values, tf.stack([users, kernel.shape[0]]))
            product = tf.matmul(dense, kernel)
        else:
            index = tf.stack([batch.rows, batch.item_idx], axis=1)
            shape = tf.cast(tf.stack([users, kernel.shape[0]]), tf.int64)
            half = tf.shape(values)[0] // 2
            parts = [tf.SparseTensor(index[:half], values[:half], shape),
                     tf.SparseTensor(index[half:], values[half:], shape)]
            product = tf.add_n([tf.sparse.sparse_dense_matmul(part, kernel) for part in parts])
        return self.activation(product + self.bias.value)


class Affine(keras.layers.Layer):
    """``activation(x @ kernel + bias)`` in the compute dtype (a ``keras.layers.Dense``).

    Not ``keras.layers.Dense``: Keras adds its bias with ``tf.nn.bias_add`` in every dtype
    (see ``add_bias``).
    """

    def __init__(self, n_inputs: int, units: int, seed: int, layer: int,
                 activation: str | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)
        init = _initializers(seed, layer)
        self.kernel = self.add_weight(shape=(n_inputs, units), name="kernel",
                                      initializer=init["kernel_initializer"])
        self.bias = self.add_weight(shape=(units,), name="bias",
                                    initializer=init["bias_initializer"])
        self.activation = keras.activations.get(activation)

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        dtype = tf.as_dtype(self.compute_dtype)
        out = tf.matmul(tf.cast(inputs, dtype), tf.cast(self.kernel.value, dtype))
        return self.activation(add_bias(out, tf.cast(self.bias.value, dtype)))


class ItemLogits(keras.layers.Layer):
    """``h @ kernel + bias`` over the padded items, in the compute dtype (one fused kernel).

    Padded items get the dtype's most negative logit through the bias, so they take no
    probability mass and get no gradient.
    """

    def __init__(self, hidden: int, n_items: int, items: ItemRange, seed: int,
                 **kwargs: object) -> None:
        super().__init__(**kwargs)
        limit = _glorot_limit(hidden, items.total)
        self.kernel = self.add_weight(shape=(hidden, items.held), name="kernel",
                                      initializer=ItemDraw(seed, 6, items.first, 1, limit))
        self.bias = self.add_weight(shape=(items.held,), name="bias",
                                    initializer=ItemDraw(seed, 7, items.first, 0, None))
        self._is_pad = tf.range(items.first, items.first + items.held) >= n_items

    def call(self, hidden: tf.Tensor) -> tf.Tensor:
        dtype = tf.as_dtype(self.compute_dtype)
        kernel = tf.cast(self.kernel.value, dtype)
        return add_bias(tf.matmul(tf.cast(hidden, dtype), kernel), self._masked_bias(dtype))

    def _masked_bias(self, dtype: tf.DType) -> tf.Tensor:
        """The bias [padded items] in ``dtype``, the dtype's minimum at the padded items."""
        return tf.where(self._is_pad, tf.constant(dtype.min, dtype),
                        tf.cast(self.bias.value, dtype))

    def nll(self, hidden: tf.Tensor, batch: SparseBatch, chunk: int | None) -> tf.Tensor:
        """Per-user multinomial NLL, float32 [users], of this layer's logits of ``hidden``.

        ``chunk`` None: from the whole [users, items] logits; else ``loss.chunked_nll`` over
        chunks of this many items (the bias and the log-sum-exp in float32 either way).
        """
        if chunk is None:
            return loss.multinomial_nll(self(hidden), batch)
        dtype = tf.as_dtype(self.compute_dtype)
        return loss.chunked_nll(tf.cast(hidden, dtype), tf.cast(self.kernel.value, dtype),
                                self._masked_bias(tf.float32), batch, chunk)

    def sharded_nll(self, hidden: tf.Tensor, entries: loss.Entries, chunk: int | None,
                    shard: item_shard.ItemShard) -> tf.Tensor:
        """``nll`` when this layer's columns are sharded by item (``item_shard.nll``)."""
        dtype = tf.as_dtype(self.compute_dtype)
        return item_shard.nll(tf.cast(hidden, dtype), tf.cast(self.kernel.value, dtype),
                              self._masked_bias(tf.float32), entries, chunk or shard.width,
                              shard)
