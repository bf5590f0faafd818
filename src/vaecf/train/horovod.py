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
import tensorflow as tf

from vaecf import log
from vaecf.errors import VaecfError
from vaecf.model import MultVAE, SparseBatch, beta_at, gaussian_kl, l2_penalty
from vaecf.train import devices
from vaecf.train.config import TrainConfig
from vaecf.train.optimizer import FusedAdam


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
    if config.batch_size % size:
        raise VaecfError(f"--batch-size {config.batch_size}: the global batch must divide "
                         f"evenly over {size} processes")


def make_optimizer(config: TrainConfig) -> keras.optimizers.Optimizer:
    """Adam, wrapped for dynamic loss scaling under float16."""
    adam = FusedAdam(learning_rate=config.learning_rate)
    if config.precision == "mixed_float16":
        return keras.optimizers.LossScaleOptimizer(adam)
    return adam


StepFn = Callable[[SparseBatch, tf.Tensor], tf.Tensor]


def make_train_step(model: MultVAE, optimizer: keras.optimizers.Optimizer,
                    config: TrainConfig, runtime: Runtime) -> StepFn:
    """One data-parallel update: (batch, step) -> float32 [5], the averaged [loss, nll, kl,
    beta] and 1 if the optimizer skipped the step (float16 gradients overflowed), else 0.

    The step returns device tensors and never waits for the device: the caller reads them
    back in blocks (``trainer.READ_EVERY``).
    """
    hvd, size = runtime.hvd, runtime.size
    if config.anneal_steps is None:
        raise ValueError("anneal_steps unset: pass config.resolved(steps_per_epoch)")
    anneal_steps = config.anneal_steps
    scaling = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    variables = model.trainable_variables

    def gradients(batch: SparseBatch, step_idx: tf.Tensor) -> tuple[tf.Tensor, list]:
        beta = beta_at(step_idx, config.beta_cap, anneal_steps)
        with tf.GradientTape() as tape:  # Horovod: plain tape (Keras 3 breaks the wrapper)
            nll, mu, logvar = model.likelihood(batch, training=True, step=step_idx)
            nll = tf.reduce_mean(nll)
            kl = tf.reduce_mean(gaussian_kl(mu, logvar))
            penalty = l2_penalty([k.value for k in model.weight_kernels()], config.l2)
            loss = nll + beta * kl + penalty
            scaled = optimizer.scale_loss(loss) if scaling else loss  # Horovod: fp16 scale
        # Dense gradients (the gather of the --xla first layer gives IndexedSlices): the fused
        # Adam update and the allreduce take one dense tensor per variable.
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(scaled, variables)]
        return tf.stack([loss, nll, kl, beta]), grads

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

    if size == 1:  # --xla compiles the whole step: forward, loss, gradients, apply. Each
        # batch shape is its own trace (no reduce_retracing): one compile per traced shape.
        return tf.function(step, reduce_retracing=not config.xla, jit_compile=config.xla)
    # XLA cannot compile Horovod's collectives: compile the two halves around them.
    compiled_gradients = tf.function(gradients, jit_compile=config.xla)
    compiled_apply = tf.function(apply, jit_compile=config.xla)
    # --compression fp16: every tensor of the group travels as float16 (Horovod requires one
    # dtype per group), the logged statistics too: the averaged loss keeps ~3 digits.
    compression = hvd.Compression.fp16 if config.compression == "fp16" else hvd.Compression.none

    def distributed_step(batch: SparseBatch, step_idx: tf.Tensor) -> tf.Tensor:
        stats, grads = compiled_gradients(batch, step_idx)
        # Horovod: one allreduce per step averages the gradients and the logged statistics
        *grads, stats = hvd.grouped_allreduce([*grads, stats], op=hvd.Average,
                                              compression=compression)
        skipped = compiled_apply(grads)  # Horovod: unscale (fp16), skip if not finite
        return tf.concat([stats, [skipped]], 0)

    return tf.function(distributed_step, reduce_retracing=True)


def _tf_variables(variables: Sequence[keras.Variable]) -> list[tf.Variable]:
    return [v.value for v in variables]


def broadcast_state(model: MultVAE, optimizer: keras.optimizers.Optimizer,
                    runtime: Runtime) -> None:
    """Make every rank hold rank 0's model and optimizer variables."""
    if runtime.size > 1:
        runtime.hvd.broadcast_variables(_tf_variables(model.variables),  # Horovod: model
                                        root_rank=0)
        runtime.hvd.broadcast_variables(_tf_variables(optimizer.variables),  # Horovod: opt
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
