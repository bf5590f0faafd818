"""Many training steps per call: a loop inside one compiled function.

One call runs ``count`` consecutive steps of a pass: each step's batch is gathered inside the
loop from the CSR rows where they live (``data.BatchMaker.gather``: on the GPU on a GPU host)
by the pass's user permutation (placed there once per pass), its step index and KL weight
computed on the device from the call's first step, and its statistics written to a buffer
read back once per call. The host issues one call per ``count`` steps instead of a gather, a
step and a read per step: the loop the GPU waited on (5.2 ms of a 6.3 ms H100 step
at batch 4096 was the host's ``next(batches)``).

The loop's body is the one training step (``horovod.train_step``); ``start`` and ``count``
are tensors, so every call of a pass, of any length, runs the same traced (and under
``--xla`` compiled) program: the same arithmetic per step whatever the steps per call, hence
the same weights bit for bit (tests/unit/test_train_calls.py).

The steps per call (``--steps-per-call``, 0 = chosen here) stop at a pass's end, so the
trainer acts between calls at its boundaries: broadcasts after the first step, the composite
prior's update between passes, validation, checkpoints and signals between epochs.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable

import tensorflow as tf

from vaecf.model import SparseBatch

__all__ = ["CallClock", "CallSizer", "make_train_call"]

# A chosen call lasts about this long: one read of the device per call costs a gap of a few
# host launches (~1 ms), so 1/4 s leaves it under 1% of the time, and a progress line, a
# non-finite loss or a signal waits no more than this.
CALL_SECONDS = 0.25
STATS = 5  # per step: loss, nll, kl, beta, skipped (``horovod.train_step``)

StepFn = Callable[[SparseBatch, tf.Tensor], tf.Tensor]
GatherFn = Callable[[tf.Tensor, "tf.Tensor | int"], SparseBatch]


def make_train_call(step: StepFn, gather: GatherFn, *, limit: int,
                    jit_compile: bool) -> tf.types.experimental.GenericFunction:
    """The compiled call: (users, padded, start, count, first_step) -> float32 [limit, 5].

    Args:
      step: one training step (``horovod.train_step``), uncompiled.
      gather: the batch of users (int64 [b]) padded to ``padded`` entries (``BatchMaker.gather``).
      limit: steps per call at most (the statistics buffer's rows: a static shape for XLA).
      jit_compile: XLA compiles the whole loop, gathers and steps (``--xla``, one process).

    The call's arguments: ``users`` int64 [steps, b] (the pass's, on the matrix's device);
    ``padded`` int64 [steps] (host) or one Python int (XLA: a shape, traced once per value);
    ``start``, ``count``, ``first_step`` int64 scalars: steps ``start .. start + count - 1``
    of the pass, the first of them the run's step ``first_step``. Rows ``count ..`` of the
    result are zero.
    """

    rows = tf.range(limit, dtype=tf.int64)[:, tf.newaxis]
    # On a GPU the slices' begin and tf.range's limit are host memory: the step's position
    # in the pass and its padded size are computed on the host, so no step waits for the
    # device to learn them (XLA compiles the loop whole and places nothing).
    host = contextlib.nullcontext if jit_compile else lambda: tf.device("/CPU:0")

    def call(users: tf.Tensor, padded: tf.Tensor | int, start: tf.Tensor, count: tf.Tensor,
             first_step: tf.Tensor) -> tf.Tensor:
        def one_step(i: tf.Tensor, stats: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            with host():
                index = start + i
                size = padded if isinstance(padded, int) else padded[index]
            # A gather, not users[index]: a slice's begin is host memory on a GPU, and the
            # stack that builds it from the index would run on the device (a wait per step).
            batch = gather(tf.gather(users, index), size)
            # Row i of the statistics, by a select: no TensorList (and a non-finite step
            # stays in its own row).
            return i + 1, tf.where(rows == i, step(batch, first_step + i)[tf.newaxis], stats)

        _, stats = tf.while_loop(lambda i, _: i < count, one_step,
                                 (tf.constant(0, tf.int64), tf.zeros([limit, STATS])))
        return stats

    return tf.function(call, jit_compile=jit_compile, reduce_retracing=not jit_compile)


class CallSizer:
    """How many steps each call runs: ``requested`` (``--steps-per-call``), or with 0 as many
    as last about ``CALL_SECONDS``, from the speed measured over the previous pass.

    The choice depends only on ``measure``'s figure, which the trainer takes from rank 0 at
    each pass's start: every rank cuts its passes into the same calls. Before a pass has been
    measured, calls double from one step (1, 2, 4, ...), so the first calls, which trace and
    compile, stay short.
    """

    def __init__(self, requested: int, limit: int) -> None:
        self.requested, self.limit = requested, limit
        self.seconds_per_step: float | None = None
        self._ramp = 1

    def steps(self, remaining: int) -> int:
        """Steps of the next call of a pass with ``remaining`` steps left (>= 1)."""
        if self.requested:
            count = self.requested
        elif self.seconds_per_step is None:
            count, self._ramp = self._ramp, self._ramp * 2
        else:
            count = math.floor(CALL_SECONDS / max(self.seconds_per_step, 1e-9))
        return max(1, min(count, remaining, self.limit))

    def measure(self, seconds_per_step: float | None) -> None:
        """Size the next calls on this speed (None: keep the last)."""
        if seconds_per_step is not None and seconds_per_step > 0:
            self.seconds_per_step = seconds_per_step


class CallClock:
    """Seconds per step of the calls read since the last ``take``, for ``CallSizer.measure``.

    A call's results are read after the next call is queued, so in a steady state the time
    between two reads is the device's time for the steps of the second; the first read
    after a ``take`` starts the clock (what ran before it: tracing, compiling, validation).
    """

    def __init__(self) -> None:
        self._last: float | None = None
        self._seconds, self._steps = 0.0, 0

    def read(self, steps: int) -> None:
        """A call of ``steps`` steps has just been read back."""
        now = time.perf_counter()
        if self._last is not None:
            self._seconds += now - self._last
            self._steps += steps
        self._last = now

    def take(self) -> float | None:
        """Seconds per step since the last ``take`` (None before any was measured)."""
        value = self._seconds / self._steps if self._steps else None
        self._last, self._seconds, self._steps = None, 0.0, 0  # no validation between passes
        return value
