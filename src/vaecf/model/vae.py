"""Mult-VAE (Liang et al., WWW 2018) in Keras 3, with a sparse input layer.

Architecture: input -> L2 normalise -> dropout -> 600 tanh -> (mu, logvar) of 200 ->
reparameterised sample (the mean at inference) -> 600 tanh -> item logits.

A batch is a ``SparseBatch``: the users' items as (row, item_idx, value) triples, never a
dense users x items matrix. The first layer multiplies that sparse batch by its kernel, so
its cost and its gradient scale with the batch's non-zeros, not with the item count. The
item dimension is padded to a multiple of 8 (tensor-core and vector friendly); padded items
get the most negative logit so they take no probability mass and receive no gradient.

Initialisation follows the paper's code: Xavier (Glorot uniform) weights and truncated
normal biases with standard deviation 0.001 (Keras' zero biases cost accuracy). The item-sized
weights are drawn per item (``ItemDraw``), so an item shard starts as the whole model's slice.
Under a mixed policy the dense layers compute in float16/bfloat16 with float32 variables;
the sparse first layer, the latent statistics and the logits stay float32.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import keras
import tensorflow as tf

from vaecf.model import loss, noise
from vaecf.model import shard as item_shard

PAD_MULTIPLE = 8
WHOLE_LOGITS_BYTES = 1 << 30  # one step's float32 logits above this: chunked likelihood
CHUNK_LOGITS_BYTES = 64 << 20  # float32 logits of one chunk (chunk = this / 4 / users)


class SparseBatch(NamedTuple):
    """A batch of users' items in coordinate form (padding entries have value 0).

    Attributes:
      rows: int64 [nnz], row of each entry in the batch (0..users-1).
      item_idx: int64 [nnz], contiguous item index of each entry.
      values: float32 [nnz], the entry (1 for an implicit positive, 0 for padding).
      user_idx: int64 [users], global user index of each row (keys the random noise).
    """

    rows: tf.Tensor
    item_idx: tf.Tensor
    values: tf.Tensor
    user_idx: tf.Tensor


def padded_items(n_items: int) -> int:
    """``n_items`` rounded up to a multiple of 8."""
    return -(-n_items // PAD_MULTIPLE) * PAD_MULTIPLE


def choose_item_chunk(users: int, n_padded: int, requested: int | None) -> int | None:
    """Items per chunk of the training likelihood for ``users`` per step (None: unchunked).

    ``requested`` 0 means unchunked and a positive count is taken as given. By default the
    likelihood is chunked only once one step's float32 logits pass ``WHOLE_LOGITS_BYTES``:
    measured on 2 CPU cores (fp32), the chunked step was ~2x slower (it recomputes the
    decoder product backward) and its item-sized kernel gradient is copied once more, so it
    pays off only where the [users, items] arrays (logits, softmax, gradient) dominate:
    2,000 users x 100k items peaked at 2.1 GB chunked against 4.1 GB whole.
    """
    if requested is not None:
        return requested or None
    if users * n_padded * 4 <= WHOLE_LOGITS_BYTES:
        return None
    return max(PAD_MULTIPLE, min(n_padded, CHUNK_LOGITS_BYTES // (4 * max(users, 1))))


def add_bias(x: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    """``x + bias`` over the last axis, written per dtype for speed.

    float32: ``tf.nn.bias_add``, which oneDNN fuses with the preceding matmul on CPU.
    float16/bfloat16: a plain "+": TensorFlow's half-precision BiasAddGrad is a naive GPU kernel
    that took 67% of an H100's step under mixed_float16 (150k -> 357k users/s with "+",
    DESIGN.md section 8).
    """
    return tf.nn.bias_add(x, bias) if x.dtype == tf.float32 else x + bias


def _initializers(seed: int, layer: int) -> dict[str, keras.initializers.Initializer]:
    """Paper initialisation, seeded per layer so every Horovod rank starts identical."""
    base = seed * 8 + 2 * layer
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
    """

    def __init__(self, items: ItemRange, units: int, seed: int, form: str = "halves",
                 **kwargs: object) -> None:
        super().__init__(dtype="float32", **kwargs)
        if form not in FIRST_LAYER_FORMS:
            raise ValueError(f"first layer form {form!r}: expected one of {FIRST_LAYER_FORMS}")
        self.form = form
        limit = _glorot_limit(items.total, units)
        self.kernel = self.add_weight(shape=(items.held, units), name="kernel",
                                      initializer=ItemDraw(seed, 0, items.first, 0, limit))
        self.bias = self.add_weight(shape=(units,), name="bias",
                                    initializer=_initializers(seed, 0)["bias_initializer"])

    def sharded(self, entries: loss.Entries, users: tf.Tensor,
                shard: item_shard.ItemShard) -> tf.Tensor:
        """The layer's output [users, hidden] when its rows are sharded by item."""
        product = item_shard.first_layer(entries, self.kernel.value, users, shard)
        return tf.tanh(product + self.bias.value)

    def shared(self, batch: SparseBatch, values: tf.Tensor, users: tf.Tensor,
               shard: item_shard.ItemShard) -> tf.Tensor:
        """The layer's output [users, hidden] of a batch every rank holds alike, its rows
        sharded by item."""
        entries = loss.Entries.of(batch, shard.first)._replace(values=values)
        product = item_shard.shared_first_layer(entries, self.kernel.value, users, shard)
        return tf.tanh(product + self.bias.value)

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
        return tf.tanh(product + self.bias.value)


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


class MultVAE(keras.Model):
    """Mult-VAE returning float32 logits [users, padded items], mu and logvar [users, latent].

    Args:
      n_items: real number of items (the logits are padded to a multiple of 8).
      hidden: width of the encoder and decoder hidden layers (paper: 600).
      latent: dimension of the latent code (paper: 200).
      dropout: input dropout rate during training (paper: 0.5).
      policy: Keras dtype policy of the dense layers ("float32", "mixed_bfloat16", ...).
      seed: seed of the dropout and sampling noise.
      xla: write every op so that XLA compiles it (``--xla`` compiles the whole training
        step; the sparse first layer becomes a gather and a segment sum).
      item_chunk: compute the training likelihood over chunks of this many items
        (``loss.chunked_nll``; None: from the whole [users, items] logits).
      first_layer: the first layer's form (default: ``first_layer_form(xla)``).
      shard: this rank's share of the items (``--shard-items``): the first layer's rows and
        the decoder's columns of those items only; trains through ``likelihood`` alone, and
        every rank calls the model on the same batch for the logits of every item.
    """

    def __init__(self, n_items: int, hidden: int = 600, latent: int = 200,
                 dropout: float = 0.5, policy: str = "float32", seed: int = 0,
                 xla: bool = False, first_layer: str | None = None,
                 item_chunk: int | None = None,
                 shard: item_shard.ItemShard | None = None) -> None:
        super().__init__()
        self.n_items = n_items
        self.item_chunk = item_chunk
        self.shard = shard
        self.n_padded = padded_items(n_items)
        items = (ItemRange(0, self.n_padded, self.n_padded) if shard is None
                 else ItemRange(shard.first, shard.width, self.n_padded))
        self.latent = latent
        self.dropout = dropout
        self.seed = seed
        self.encoder_hidden = SparseDense(items, hidden, seed,
                                          first_layer or first_layer_form(xla),
                                          name="encoder_hidden")
        self.encoder_out = Affine(hidden, 2 * latent, seed, 1, name="encoder_out", dtype=policy)
        self.decoder_hidden = Affine(latent, hidden, seed, 2, activation="tanh", dtype=policy,
                                     name="decoder_hidden")
        self.decoder_out = ItemLogits(hidden, n_items, items, seed, name="decoder_out",
                                      dtype=policy)

    def call(self, batch: SparseBatch, training: bool = False,
             step: tf.Tensor | int = 0) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(float32 logits [users, padded items], mu, logvar [users, latent])."""
        logits, mu, logvar = self.forward(batch, training, step)
        return tf.cast(logits, tf.float32), mu, logvar

    def forward(self, batch: SparseBatch, training: bool = False,
                step: tf.Tensor | int = 0) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Like ``call`` but the logits stay in the compute dtype (the loss upcasts them).

        With item shards every rank calls it on the same batch (a collective) and gets the
        logits of every item (float32 [users, size * width]).
        """
        hidden, mu, logvar = self._decoder_hidden(batch, training, step)
        if self.shard is None:
            return self.decoder_out(hidden), mu, logvar
        logits = tf.cast(self.decoder_out(hidden), tf.float32)
        return item_shard.all_items(logits, self.shard), mu, logvar

    def likelihood(self, batch: SparseBatch, training: bool = False,
                   step: tf.Tensor | int = 0) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(per-user multinomial NLL float32 [users], mu, logvar): what training minimises,
        over item chunks when ``item_chunk`` is set."""
        if self.shard is not None:
            return self._sharded_likelihood(batch, training, step, self.shard)
        hidden, mu, logvar = self._decoder_hidden(batch, training, step)
        return self.decoder_out.nll(hidden, batch, self.item_chunk), mu, logvar

    def _sharded_likelihood(self, batch: SparseBatch, training: bool, step: tf.Tensor | int,
                            shard: item_shard.ItemShard
                            ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """``likelihood`` with the item layers sharded (``vaecf.model.shard``)."""
        users = tf.shape(batch.user_idx)[0]  # int32: see SparseDense.call
        inputs = item_shard.global_entries(batch.rows, batch.item_idx,
                                           self._input_values(batch, training, step), users,
                                           shard)
        # the targets are the same entries with their own values: rows and items gathered once
        targets = inputs._replace(values=shard.collectives.allgather(batch.values))
        hidden, mu, logvar = self._dense(self.encoder_hidden.sharded(inputs, users, shard),
                                         batch.user_idx, step, training)
        return (self.decoder_out.sharded_nll(hidden, targets, self.item_chunk, shard), mu,
                logvar)

    def _decoder_hidden(self, batch: SparseBatch, training: bool,
                        step: tf.Tensor | int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(decoder hidden activations [users, hidden], mu, logvar [users, latent])."""
        users = tf.shape(batch.user_idx)[0]  # int32: see SparseDense.call
        values = self._input_values(batch, training, step)
        if self.shard is None:
            first = self.encoder_hidden(batch, values, users)
        else:  # every rank holds this batch: the rows' partial sums are allreduced
            first = self.encoder_hidden.shared(batch, values, users, self.shard)
        return self._dense(first, batch.user_idx, step, training)

    def _input_values(self, batch: SparseBatch, training: bool,
                      step: tf.Tensor | int) -> tf.Tensor:
        """float32 [nnz]: the first layer's input, L2-normalised per user (and dropped out)."""
        users = tf.shape(batch.user_idx)[0]  # int32: see SparseDense.call
        values = self._normalise(batch, users)
        if training and self.dropout > 0.0:
            entry_user = tf.gather(batch.user_idx, batch.rows)
            keep = noise.uniform(self.seed, noise.STREAM_DROPOUT, step, entry_user,
                                 batch.item_idx) >= self.dropout
            values = tf.where(keep, values / (1.0 - self.dropout), 0.0)
        return values

    def _dense(self, hidden: tf.Tensor, user_idx: tf.Tensor, step: tf.Tensor | int,
               training: bool) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Encoder hidden activations [users, hidden] -> (decoder hidden, mu, logvar)."""
        stats = tf.cast(self.encoder_out(hidden), tf.float32)
        mu, logvar = stats[:, :self.latent], stats[:, self.latent:]
        z = mu
        if training:
            eps = noise.normal(self.seed, step, user_idx, self.latent)
            z = mu + eps * tf.exp(0.5 * logvar)
        return self.decoder_hidden(z), mu, logvar

    @staticmethod
    def _normalise(batch: SparseBatch, users: tf.Tensor) -> tf.Tensor:
        """Divide each user's values by the L2 norm of the user's row."""
        # float32 values: a float16/bfloat16 segment reduction is ~10x slower on an H100.
        norm_sq = tf.math.unsorted_segment_sum(tf.square(batch.values), batch.rows, users)
        scale = tf.math.rsqrt(tf.maximum(norm_sq, 1e-12))
        return batch.values * tf.gather(scale, batch.rows)

    def build_variables(self) -> None:
        """Create every variable by calling the model once on an empty batch."""
        if self.shard is not None:  # created in __init__; a call would need every rank
            self.built = True
            return
        empty = tf.zeros([0], tf.int64)
        self(SparseBatch(empty, empty, tf.zeros([0]), tf.zeros([1], tf.int64)))

    def sharded_variables(self) -> list[keras.Variable]:
        """The variables each rank holds its own share of (never averaged over ranks)."""
        if self.shard is None:
            return []
        return [self.encoder_hidden.kernel, self.decoder_out.kernel, self.decoder_out.bias]

    def penalty(self, l2: float) -> tf.Tensor:
        """``l2 * sum ||W||^2`` over the whole model's kernels (every shard's)."""
        if self.shard is None:
            return loss.l2_penalty([k.value for k in self.weight_kernels()], l2)
        sharded = [self.encoder_hidden.kernel.value, self.decoder_out.kernel.value]
        return (loss.l2_penalty([self.encoder_out.kernel.value,
                                 self.decoder_hidden.kernel.value], l2)
                + item_shard.penalty(sharded, l2, self.shard))

    def weight_kernels(self) -> list[keras.Variable]:
        """The kernels (not the biases): what the optional L2 penalty applies to."""
        return [layer.kernel for layer in (self.encoder_hidden, self.encoder_out,
                                           self.decoder_hidden, self.decoder_out)]
