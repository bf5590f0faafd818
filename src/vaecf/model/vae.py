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

from typing import NamedTuple

import keras
import tensorflow as tf

from vaecf.model import loss, noise
from vaecf.model import shard as item_shard
from vaecf.model.batch import SparseBatch
from vaecf.model.layers import Affine, ItemLogits, ItemRange, SparseDense, first_layer_form

PAD_MULTIPLE = 8
# One step's float32 logits above this, on a device of this kind: chunked likelihood.
# CPU: measured on 2 cores (fp32), the chunked step was ~2x slower (see choose_item_chunk).
# GPU: measured on one H100 (2026-11-26, fp32, no --xla), 16,384 users x 20,096 items (1.3 GB
# of logits) chunked ran at 123k users/s, 4.3x slower per user than 4,096 users whole (533k);
# 4 GiB of whole logits (by arithmetic, not measured: ~12 GiB with the softmax and gradient).
WHOLE_LOGITS_BYTES = {"CPU": 1 << 30, "GPU": 4 << 30}
CHUNK_LOGITS_BYTES = 64 << 20  # float32 logits of one chunk (chunk = this / 4 / users)


PHASES = ("joint", "encoder", "decoder")  # what one training update changes


class Encoder(NamedTuple):
    """The encoder's layers: the sparse first layer, the latent statistics, and RecVAE's
    dense blocks with their LayerNorms (``norms[0]`` after the first layer; none for
    Mult-VAE's encoder)."""

    first: SparseDense
    out: Affine
    blocks: list[Affine]
    norms: list[keras.layers.LayerNormalization]

    def layers(self) -> list[keras.layers.Layer]:
        return [self.first, *self.blocks, *self.norms, self.out]

    def variables(self) -> list[keras.Variable]:
        """Every variable, in one fixed order (the frozen copy mirrors it)."""
        return [v for layer in self.layers() for v in layer.weights]


def encoder(items: ItemRange, hidden: int, latent: int, seed: int, form: str, policy: str,
            layers: int, name: str) -> tuple[SparseDense, Affine, list[Affine],
                                              list[keras.layers.LayerNormalization]]:
    """The encoder's layers (``Encoder``'s fields) of ``layers`` hidden layers.

    One layer: Mult-VAE's tanh layer. More: RecVAE's, swish and LayerNorm (epsilon 0.1, as
    its code) on every hidden layer; the LayerNorms compute in float32 under a mixed policy.
    """
    deep = layers > 1
    first = SparseDense(items, hidden, seed, form, activation="silu" if deep else "tanh",
                        name=f"{name}_hidden")
    out = Affine(hidden, 2 * latent, seed, 1, name=f"{name}_out", dtype=policy)
    blocks = [Affine(hidden, hidden, seed, 4 + i, name=f"{name}_block_{i + 1}", dtype=policy)
              for i in range(layers - 1)]
    norms = [keras.layers.LayerNormalization(epsilon=0.1, name=f"{name}_norm_{i}",
                                             dtype=policy)
             for i in range(layers if deep else 0)]
    for norm in norms:  # now, not at the first call: the variables exist before any call
        norm.build((None, hidden))
    return first, out, blocks, norms


def padded_items(n_items: int) -> int:
    """``n_items`` rounded up to a multiple of 8."""
    return -(-n_items // PAD_MULTIPLE) * PAD_MULTIPLE


def choose_item_chunk(users: int, n_padded: int, requested: int | None,
                      device_kind: str = "CPU") -> int | None:
    """Items per chunk of the training likelihood for ``users`` per step (None: unchunked).

    ``requested`` 0 means unchunked and a positive count is taken as given. By default the
    likelihood is chunked only once one step's float32 logits pass ``WHOLE_LOGITS_BYTES`` of
    the ``device_kind`` (``"CPU"`` or ``"GPU"``) that computes them:
    measured on 2 CPU cores (fp32), the chunked step was ~2x slower (it recomputes the
    decoder product backward) and its item-sized kernel gradient is copied once more, so it
    pays off only where the [users, items] arrays (logits, softmax, gradient) dominate:
    2,000 users x 100k items peaked at 2.1 GB chunked against 4.1 GB whole.
    """
    if requested is not None:
        return requested or None
    if users * n_padded * 4 <= WHOLE_LOGITS_BYTES[device_kind]:
        return None
    return max(PAD_MULTIPLE, min(n_padded, CHUNK_LOGITS_BYTES // (4 * max(users, 1))))


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
      encoder_layers: 1: Mult-VAE's encoder (one tanh layer). N > 1: RecVAE's (Shenbin et
        al., WSDM 2020) N dense layers with swish and LayerNorm, each fed the sum of the
        earlier ones (``--encoder-layers``). The decoder and every shape a request sees are
        the same either way.
      composite_prior: hold a frozen copy of the encoder (non-trainable, updated by
        ``update_prior``) and measure the KL term against RecVAE's composite prior
        (``kl``; ``--composite-prior``).
    """

    def __init__(self, n_items: int, hidden: int = 600, latent: int = 200,
                 dropout: float = 0.5, policy: str = "float32", seed: int = 0,
                 xla: bool = False, first_layer: str | None = None,
                 item_chunk: int | None = None,
                 shard: item_shard.ItemShard | None = None, encoder_layers: int = 1,
                 composite_prior: bool = False) -> None:
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
        form = first_layer or first_layer_form(xla)
        # The variables in today's order (checkpoints index them), the new ones after.
        self.encoder_hidden, self.encoder_out, self.encoder_blocks, self.encoder_norms = (
            encoder(items, hidden, latent, seed, form, policy, encoder_layers, "encoder"))
        self.decoder_hidden = Affine(latent, hidden, seed, 2, activation="tanh", dtype=policy,
                                     name="decoder_hidden")
        self.decoder_out = ItemLogits(hidden, n_items, items, seed, name="decoder_out",
                                      dtype=policy)
        # The previous posterior of the composite prior: the same layers from the same seeds
        # (so it starts as the encoder), never trained, copied from the encoder by
        # ``update_prior``.
        self.prior_layers: Encoder | None = None
        if composite_prior:
            self.prior_layers = Encoder(*encoder(items, hidden, latent, seed, form, policy,
                                                 encoder_layers, "prior"))
            for layer in self.prior_layers.layers():
                layer.trainable = False

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
                   step: tf.Tensor | int = 0, drop: bool = True
                   ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(per-user multinomial NLL float32 [users], mu, logvar): what training minimises,
        over item chunks when ``item_chunk`` is set.

        ``drop`` False: no input dropout even in training (the decoder-only passes of
        ``--alternate``); the latent code is still sampled.
        """
        if self.shard is not None:
            return self._sharded_likelihood(batch, training, step, self.shard, drop)
        hidden, mu, logvar = self._decoder_hidden(batch, training, step, drop)
        return self.decoder_out.nll(hidden, batch, self.item_chunk), mu, logvar

    def _sharded_likelihood(self, batch: SparseBatch, training: bool, step: tf.Tensor | int,
                            shard: item_shard.ItemShard, drop: bool = True
                            ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """``likelihood`` with the item layers sharded (``vaecf.model.shard``)."""
        users = tf.shape(batch.user_idx)[0]  # int32: see SparseDense.call
        inputs = item_shard.global_entries(batch.rows, batch.item_idx,
                                           self._input_values(batch, training and drop, step),
                                           users, shard)
        # the targets are the same entries with their own values: rows and items gathered once
        targets = inputs._replace(values=shard.collectives.allgather(batch.values))
        hidden, mu, logvar = self._dense(self.encoder_hidden.sharded(inputs, users, shard),
                                         batch.user_idx, step, training)
        return (self.decoder_out.sharded_nll(hidden, targets, self.item_chunk, shard), mu,
                logvar)

    def _decoder_hidden(self, batch: SparseBatch, training: bool, step: tf.Tensor | int,
                        drop: bool = True) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(decoder hidden activations [users, hidden], mu, logvar [users, latent])."""
        users = tf.shape(batch.user_idx)[0]  # int32: see SparseDense.call
        values = self._input_values(batch, training and drop, step)
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
        """First-layer activations [users, hidden] -> (decoder hidden, mu, logvar)."""
        mu, logvar = self._statistics(hidden, self.encoder_layers())
        z = self._sample(mu, logvar, user_idx, step) if training else mu
        return self.decoder_hidden(z), mu, logvar

    def _statistics(self, first: tf.Tensor, layers: Encoder) -> tuple[tf.Tensor, tf.Tensor]:
        """First-layer activations [users, hidden] -> float32 (mu, logvar) [users, latent]
        through ``layers``' dense part (RecVAE: h_k = LN(swish(dense(h_k-1) + sum h_<k)))."""
        hidden = first
        if layers.norms:
            dtype = tf.as_dtype(layers.out.compute_dtype)
            earlier = [tf.cast(layers.norms[0](first), dtype)]
            for block, norm in zip(layers.blocks, layers.norms[1:], strict=True):
                total = tf.add_n(earlier)
                earlier.append(tf.cast(norm(tf.nn.silu(block(earlier[-1]) + total)), dtype))
            hidden = earlier[-1]
        stats = tf.cast(layers.out(hidden), tf.float32)
        return stats[:, :self.latent], stats[:, self.latent:]

    def _sample(self, mu: tf.Tensor, logvar: tf.Tensor, user_idx: tf.Tensor,
                step: tf.Tensor | int) -> tf.Tensor:
        """The reparameterised latent code [users, latent] (the same noise for the same
        (seed, step, user): ``kl`` recomputes the code ``likelihood`` decoded)."""
        eps = noise.normal(self.seed, step, user_idx, self.latent)
        return mu + eps * tf.exp(0.5 * logvar)

    def encoder_layers(self) -> Encoder:
        """The trained encoder's layers."""
        return Encoder(self.encoder_hidden, self.encoder_out, self.encoder_blocks,
                       self.encoder_norms)

    def kl(self, batch: SparseBatch, mu: tf.Tensor, logvar: tf.Tensor,
           step: tf.Tensor | int) -> tf.Tensor:
        """Per-user KL term of the training loss, float32 [users].

        Without the composite prior: KL(q(z|x) || N(0, I)) in closed form. With it, the
        one-sample estimate at the code ``likelihood`` decoded (RecVAE):
        ``log q(z|x) - log p(z|x)``, ``p`` the mixture (per latent dimension) of N(0, I), the
        frozen encoder's posterior of the same (un-dropped) input and N(0, e^10 I).
        """
        if self.prior_layers is None:
            return loss.gaussian_kl(mu, logvar)
        old_mu, old_logvar = self._old_posterior(batch)
        z = self._sample(mu, logvar, batch.user_idx, step)
        return loss.composite_kl(z, mu, logvar, tf.stop_gradient(old_mu),
                                 tf.stop_gradient(old_logvar))

    def _old_posterior(self, batch: SparseBatch) -> tuple[tf.Tensor, tf.Tensor]:
        """(mu, logvar) [users, latent] of the frozen encoder, input not dropped out."""
        layers = self.prior_layers
        assert layers is not None
        users = tf.shape(batch.user_idx)[0]  # int32: see SparseDense.call
        values = self._input_values(batch, False, 0)
        if self.shard is None:
            first = layers.first(batch, values, users)
        else:  # a collective, as the likelihood's: every rank calls it on its own batch
            entries = item_shard.global_entries(batch.rows, batch.item_idx, values, users,
                                                self.shard)
            first = layers.first.global_batch(entries, users, self.shard)
        return self._statistics(first, layers)

    def update_prior(self) -> None:
        """The composite prior's previous posterior becomes the encoder as it is now."""
        if self.prior_layers is None:
            return
        for old, new in zip(self.prior_layers.variables(), self.encoder_layers().variables(),
                            strict=True):
            old.assign(new.value)

    def phase_variables(self, phase: str) -> list[keras.Variable]:
        """The trainable variables one update of ``phase`` changes (``PHASES``): all, the
        encoder's (with input dropout) or the decoder's (without; ``--alternate``)."""
        if phase == "joint":
            return self.trainable_variables
        part = (self.encoder_layers().variables() if phase == "encoder"
                else [*self.decoder_hidden.trainable_variables,
                      *self.decoder_out.trainable_variables])
        if phase not in PHASES or not part:
            raise ValueError(f"phase {phase!r}: expected one of {PHASES}")
        ids = {id(v) for v in part}
        return [v for v in self.trainable_variables if id(v) in ids]

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
        """The variables each rank holds its own share of (never averaged over ranks): the
        trainable ones, then the frozen encoder's first-layer kernel (if any)."""
        if self.shard is None:
            return []
        frozen = [] if self.prior_layers is None else [self.prior_layers.first.kernel]
        return [self.encoder_hidden.kernel, self.decoder_out.kernel, self.decoder_out.bias,
                *frozen]

    def prior_variables(self) -> list[keras.Variable]:
        """The frozen encoder's variables: training state, not part of the exported model."""
        return [] if self.prior_layers is None else self.prior_layers.variables()

    def item_embeddings(self) -> list[tuple[keras.Variable, int]]:
        """(variable, item axis) of the two item embeddings ImplicitSLIM sets: the first
        layer's kernel [items, hidden] and the decoder's [hidden, items] (a shard's items
        with ``--shard-items``)."""
        return [(self.encoder_hidden.kernel, 0), (self.decoder_out.kernel, 1)]

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
