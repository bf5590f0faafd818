"""The one training step compiled alone, and its batches gathered one at a time, for tests
that drive single steps; the trainer runs the same ``horovod.train_step`` and
``BatchMaker.gather`` inside its compiled calls of many steps (``vaecf.train.calls``)."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from vaecf.model import MultVAE, SparseBatch
from vaecf.train import data
from vaecf.train import horovod as dist
from vaecf.train.config import TrainConfig


def lone_step(model: MultVAE, optimizer: keras.optimizers.Optimizer, config: TrainConfig,
              runtime: dist.Runtime, phase: str = "joint") -> dist.StepFn:
    """``train_step`` compiled alone, as the loop compiles it (``--xla`` whole in a world of
    one; each batch shape its own trace)."""
    whole = dist.compiles_whole(config, runtime)
    return tf.function(dist.train_step(model, optimizer, config, runtime, phase),
                       jit_compile=whole, reduce_retracing=not whole)


def gathered(maker: data.BatchMaker, users: np.ndarray,
             padded: np.ndarray | None = None) -> list[SparseBatch]:
    """The batches whose rows are ``users`` [steps, b], of ``padded`` [steps] entries
    (default: ``maker.padded_sizes`` of these users alone), gathered where the matrix lives."""
    if padded is None:
        padded = maker.padded_sizes(users[:, np.newaxis, :])
    with tf.device(maker.device or "/CPU:0"):
        return [maker.gather(tf.constant(row, tf.int64), tf.constant(size, tf.int64))
                for row, size in zip(users, padded, strict=True)]
