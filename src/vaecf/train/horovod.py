"""Horovod and mixed precision, in the order of horovod's tensorflow2 example (STYLE rule 4).

init -> pin the GPU by local rank -> precision policy -> per-rank seed -> forward and loss
under a plain tape (scaled for float16) -> allreduce gradients -> unscale/apply -> broadcast
variables after step 1 -> the reported loss travels with the gradients -> rank 0 alone
writes.

Keras 3 breaks Horovod's wrappers (``DistributedGradientTape``, ``horovod.tensorflow.keras``,
``broadcast_variables(model.variables)``), so this module uses a plain ``tf.GradientTape``,
``hvd.grouped_allreduce(op=hvd.Average)`` and broadcasts the ``tf.Variable`` behind each Keras
variable (``v.value``). Without Horovod installed, a run is a world of one.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from vaecf import log
from vaecf.errors import VaecfError
from vaecf.model import MultVAE, SparseBatch, beta_at
from vaecf.model.shard import Collectives, ItemShard, shard_width
from vaecf.train import devices
from vaecf.train.config import TrainConfig
from vaecf.train.optimizer import FusedAdam, SkippingLossScale


@dataclass(frozen=True)
class Runtime:
    """This process's place in the job."""

    rank: int
    size: int
    local_rank: int
    hosts: int
    hvd: Any  # horovod.tensorflow, or None in a world of one without Horovod

    @property
    def is_chief(self) -> bool:
        return self.rank == 0


def start(config: TrainConfig) -> Runtime:
    """Join the job, pin the device, check the job's shape, set the policy and the seeds.

    Every ``tf.config`` call (``devices.configure``) runs before the first TensorFlow op: the
    host count below is an ``allgather_object`` (TensorFlow ops), so it comes after. It is
    exact for any placement of ranks on hosts; ``hvd.cross_size()`` would need no op but
    differs between ranks when hosts run unequal numbers of ranks, and ``--expect-hosts``
    must fail on every rank alike.
    """
    try:
        import horovod.tensorflow as hvd  # Horovod: imported at run time, never at import
    except ImportError:
        hvd = None
    if hvd is not None:
        hvd.init()  # Horovod: initialise (a world of one when not launched by horovodrun)
        rank, size, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()  # Horovod:
        local_size = hvd.local_size()
    else:
        rank, size, local_rank, local_size = 0, 1, 0, 1
    log.set_quiet(rank != 0)  # Horovod: rank 0 alone logs
    gpus = devices.configure(local_rank, local_size)  # Horovod: pin the GPU by local rank
    hosts = 1
    if hvd is not None:
        hosts = len(set(hvd.allgather_object(socket.gethostname())))  # Horovod: host count
    _check_shape(config, size, hosts)
    devices.log_setup(gpus)
    keras.mixed_precision.set_global_policy(config.keras_policy)  # Horovod: precision policy
    keras.utils.set_random_seed(config.seed + rank)  # Horovod: per-rank seed
    return Runtime(rank=rank, size=size, local_rank=local_rank, hosts=hosts, hvd=hvd)


def _check_shape(config: TrainConfig, size: int, hosts: int) -> None:
    if config.expect_world_size is not None and size != config.expect_world_size:
        raise VaecfError(f"--expect-world-size {config.expect_world_size}: this job has "
                         f"{size} process(es) (launch with horovodrun -np "
                         f"{config.expect_world_size} or fix the flag)")
    if config.expect_hosts is not None and hosts != config.expect_hosts:
        raise VaecfError(f"--expect-hosts {config.expect_hosts}: this job runs on {hosts} "
                         "distinct host(s)")
    if config.shard_items and size < 2:
        raise VaecfError(f"--shard-items: this job has {size} process (launch at least 2 with "
                         "horovodrun -np N, or leave out --shard-items)")
    if config.batch_size % size:
        raise VaecfError(f"--batch-size {config.batch_size}: the global batch must divide "
                         f"evenly over {size} processes")


def make_optimizer(config: TrainConfig) -> keras.optimizers.Optimizer:
    """Adam, wrapped for dynamic loss scaling under float16."""
    adam = FusedAdam(learning_rate=config.learning_rate)
    if config.precision == "mixed_float16":
        return SkippingLossScale(adam)
    return adam


StepFn = Callable[[SparseBatch, tf.Tensor], tf.Tensor]


def kl_weight(batch: SparseBatch, step_idx: tf.Tensor, config: TrainConfig) -> tf.Tensor:
    """The KL weight, float32: annealed beta (a scalar), or with ``--kl-per-item`` RecVAE's
    gamma times each user's item count ([users]; the padding entries have value 0)."""
    if config.kl_per_item is None:
        assert config.anneal_steps is not None
        return beta_at(step_idx, config.beta_cap, config.anneal_steps)
    counts = tf.math.unsorted_segment_sum(batch.values, batch.rows,
                                          tf.shape(batch.user_idx)[0])
    return config.kl_per_item * counts


def compiles_whole(config: TrainConfig, runtime: Runtime) -> bool:
    """Whether XLA compiles ``train_step`` whole (and the loop around it): with ``--xla`` in a
    world of one. XLA cannot compile Horovod's collectives: ``train_step`` then compiles the
    two halves around them itself."""
    return config.xla and runtime.size == 1


def train_step(model: MultVAE, optimizer: keras.optimizers.Optimizer,
               config: TrainConfig, runtime: Runtime, phase: str = "joint") -> StepFn:
    """One data-parallel update: (batch, step) -> float32 [5], the averaged [loss, nll, kl,
    beta] and 1 if the optimizer skipped the step (float16 gradients overflowed), else 0.
    ``beta`` is the batch's mean KL weight under ``--kl-per-item``.

    The update is returned as a Python function for the training loop to compile inside its
    call of many steps (``vaecf.train.calls``; ``--xla`` whole when ``compiles_whole``). In a
    world of more than one its halves around the collectives are compiled here.

    ``phase`` (``MultVAE.PHASES``): "joint" updates every variable; "encoder" only the
    encoder's, "decoder" only the decoder's with no input dropout (``--alternate``: the
    trainer makes one step per phase, the same code). One optimizer serves every phase (its
    step count is shared: Adam's bias correction differs from RecVAE's two optimizers for the
    first few hundred steps only).

    The step returns device tensors and never waits for the device: the caller reads them
    back once per call of many steps.
    """
    hvd, size = runtime.hvd, runtime.size
    if config.anneal_steps is None:
        raise ValueError("anneal_steps unset: pass config.resolved(steps_per_epoch)")
    scaling = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

    variables = model.phase_variables(phase)

    def gradients(batch: SparseBatch, step_idx: tf.Tensor) -> tuple[tf.Tensor, list]:
        beta = kl_weight(batch, step_idx, config)
        with tf.GradientTape() as tape:  # Horovod: plain tape (Keras 3 breaks the wrapper)
            nll, mu, logvar = model.likelihood(batch, training=True, step=step_idx,
                                               drop=phase != "decoder")
            nll = tf.reduce_mean(nll)
            kl_u = model.kl(batch, mu, logvar, step_idx)
            kl = tf.reduce_mean(kl_u)
            penalty = model.penalty(config.l2)
            weighted = beta * kl if beta.shape.rank == 0 else tf.reduce_mean(beta * kl_u)
            loss = nll + weighted + penalty
            scaled = optimizer.scale_loss(loss) if scaling else loss  # Horovod: fp16 scale
        # Dense gradients (the gather of the --xla first layer gives IndexedSlices): the fused
        # Adam update and the allreduce take one dense tensor per variable.
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(scaled, variables)]
        mean_beta = beta if beta.shape.rank == 0 else tf.reduce_mean(beta)
        return tf.stack([loss, nll, kl, mean_beta]), grads

    def apply(grads: list) -> tf.Tensor:
        skipped = tf.constant(0.0)
        if scaling:  # the optimizer skips the step on overflow: the same scale before, after
            before = tf.convert_to_tensor(optimizer.dynamic_scale)  # read before the apply
            optimizer.apply(grads, variables)  # Horovod: unscale (fp16), skip if not finite
            return tf.cast(tf.convert_to_tensor(optimizer.dynamic_scale) < before, tf.float32)
        optimizer.apply(grads, variables)
        return skipped

    def step(batch: SparseBatch, step_idx: tf.Tensor) -> tf.Tensor:
        stats, grads = gradients(batch, step_idx)
        return tf.concat([stats, [apply(grads)]], 0)

    if size == 1:  # --xla compiles the whole step: forward, loss, gradients, apply
        return step
    # XLA cannot compile Horovod's collectives: compile the two halves around them.
    # With item shards the forward and backward passes hold collectives too: not compiled.
    compiled_gradients = tf.function(gradients, jit_compile=config.xla and not model.shard)
    compiled_apply = tf.function(apply, jit_compile=config.xla)
    # --compression fp16: every tensor of the group travels as float16 (Horovod requires one
    # dtype per group), the logged statistics too: the averaged loss keeps ~3 digits.
    compression = hvd.Compression.fp16 if config.compression == "fp16" else hvd.Compression.none

    sharded = {id(v) for v in model.sharded_variables()}
    owned = [id(v) in sharded for v in variables]

    def distributed_step(batch: SparseBatch, step_idx: tf.Tensor) -> tf.Tensor:
        stats, grads = compiled_gradients(batch, step_idx)
        # Horovod: one allreduce per step averages the replicated gradients and the logged
        # statistics; an item shard's gradient is already the sum over every rank's loss
        # (vaecf.model.shard): its average is a division, never an allreduce.
        *averaged, stats = hvd.grouped_allreduce(
            [g for g, own in zip(grads, owned, strict=True) if not own] + [stats],
            op=hvd.Average, compression=compression)
        replicated = iter(averaged)
        grads = [g / size if own else next(replicated) for g, own in zip(grads, owned,
                                                                          strict=True)]
        skipped = compiled_apply(grads)  # Horovod: unscale (fp16), skip if not finite
        return tf.concat([stats, [skipped]], 0)

    return distributed_step


def _tf_variables(variables: Sequence[keras.Variable]) -> list[tf.Variable]:
    return [v.value for v in variables]


def item_shard(runtime: Runtime, n_padded: int) -> ItemShard:
    """This rank's share of ``n_padded`` items, with Horovod's collectives."""
    hvd = runtime.hvd
    collectives = Collectives(
        allgather=hvd.allgather,  # Horovod: concatenation over ranks, in rank order
        allreduce_sum=lambda t: hvd.allreduce(t, op=hvd.Sum),  # Horovod: partial sums
        allreduce_max=lambda t: hvd.allreduce(t, op=hvd.Max))  # Horovod: per-shard max
    return ItemShard(runtime.rank, runtime.size, shard_width(n_padded, runtime.size),
                     collectives)


# Bytes of one gathered block of an item shard (every rank's part of it) at export.
GATHER_BLOCK_BYTES = 64 << 20


def whole_weights(model: MultVAE, weights: list[np.ndarray] | None,
                  runtime: Runtime) -> list[np.ndarray] | None:
    """``weights`` (this rank's, in ``model.weights`` order) as the whole model's, on rank 0;
    None on the other ranks.

    Item shards are gathered block by block of their rows (a collective: every rank calls
    it), so only rank 0 ever holds the whole model, once, and the others at most one block
    of every rank's rows at a time. Unsharded weights are rank 0's own.
    """
    if model.shard is None or weights is None:
        return weights if runtime.is_chief else None
    sharded = {id(v) for v in model.sharded_variables()}
    out = []
    for variable, value in zip(model.weights, weights, strict=True):
        if id(variable) not in sharded:
            out.append(value)
            continue
        columns = variable is model.decoder_out.kernel  # items on axis 1
        rows = value.T if columns else value
        whole = _gather_rows(rows, runtime)
        if whole is not None:
            whole = whole[:model.n_padded]
            out.append(whole.T if columns else whole)
    return out if runtime.is_chief else None


def _gather_rows(rows: np.ndarray, runtime: Runtime) -> np.ndarray | None:
    """Every rank's ``rows`` (equal shapes), concatenated in rank order, on rank 0."""
    width, size = rows.shape[0], runtime.size
    block = max(1, GATHER_BLOCK_BYTES // max(1, rows[:1].nbytes * size))
    whole = np.empty((width * size, *rows.shape[1:]), rows.dtype) if runtime.is_chief else None
    for start in range(0, width, block):
        part = np.ascontiguousarray(rows[start:start + block])
        gathered = runtime.hvd.allgather(tf.constant(part))  # Horovod: rank-major blocks
        if whole is not None:
            gathered = np.asarray(gathered).reshape(size, len(part), *rows.shape[1:])
            for rank in range(size):
                whole[rank * width + start:rank * width + start + len(part)] = gathered[rank]
    return whole


def replicated_variables(model: MultVAE, optimizer: keras.optimizers.Optimizer
                         ) -> tuple[list[keras.Variable], list[keras.Variable]]:
    """(model, optimizer) variables every rank holds alike: all but the item shards and
    their Adam moments."""
    sharded = {id(v) for v in model.sharded_variables()}
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    slots = {id(slot) for v in model.sharded_variables() if v.trainable
             for slot in (inner._momentums[inner._get_variable_index(v)],
                          inner._velocities[inner._get_variable_index(v)])}
    return ([v for v in model.variables if id(v) not in sharded],
            [v for v in optimizer.variables if id(v) not in slots])


def broadcast_state(model: MultVAE, optimizer: keras.optimizers.Optimizer,
                    runtime: Runtime) -> None:
    """Make every rank hold rank 0's model and optimizer variables (item shards stay)."""
    if runtime.size > 1:
        model_vars, optimizer_vars = replicated_variables(model, optimizer)
        runtime.hvd.broadcast_variables(_tf_variables(model_vars),  # Horovod: model
                                        root_rank=0)
        runtime.hvd.broadcast_variables(_tf_variables(optimizer_vars),  # Horovod: opt
                                        root_rank=0)


def broadcast_object(value: Any, runtime: Runtime) -> Any:
    """Rank 0's ``value`` on every rank (e.g. the checkpoint it resumed from)."""
    if runtime.size == 1:
        return value
    return runtime.hvd.broadcast_object(value, root_rank=0)  # Horovod: rank 0's decision


def gather_object(value: Any, runtime: Runtime) -> list[Any]:
    """Every rank's ``value``, in rank order (e.g. weight digests to check replicas agree)."""
    if runtime.size == 1:
        return [value]
    return list(runtime.hvd.allgather_object(value))  # Horovod: collect from all ranks


def allreduce_sum(value: np.ndarray, runtime: Runtime) -> np.ndarray:
    """The sum over ranks of every rank's ``value`` (equal shapes), e.g. a sum over users of
    which each rank holds its share."""
    if runtime.size == 1:
        return value
    return np.asarray(runtime.hvd.allreduce(tf.constant(value),  # Horovod: sum over ranks
                                            op=runtime.hvd.Sum))


def broadcast_array(value: np.ndarray, root: int, runtime: Runtime) -> np.ndarray:
    """Rank ``root``'s ``value`` on every rank (equal shapes everywhere)."""
    if runtime.size == 1:
        return value
    return np.asarray(runtime.hvd.broadcast(tf.constant(value),  # Horovod: root's array
                                            root_rank=root))
