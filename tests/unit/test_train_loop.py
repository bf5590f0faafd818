"""The training loop leaves the device alone: one read of the step results per call of many
steps, one allreduce per step."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf
from single_steps import gathered, lone_step
from tensorflow.python.framework import ops

from vaecf.errors import VaecfError
from vaecf.train import data
from vaecf.train import horovod as dist
from vaecf.train.config import TrainConfig
from vaecf.train.trainer import Trainer

READS = ("numpy", "__bool__", "__float__", "__int__", "__index__", "__array__")


def make_trainer(tmp_path, steps: int, precision: str = "fp32",
                 learning_rate: float = 1e-3, xla: bool = False,
                 steps_per_call: int = 0) -> Trainer:
    rng = np.random.default_rng(0)
    train = sp.random(64, 30, density=0.2, format="csr", random_state=rng, dtype=np.float32)
    train.data[:] = 1.0
    config = TrainConfig(split="", output="", checkpoint_dir=str(tmp_path), batch_size=8,
                         hidden=8, latent=4, steps_per_epoch=steps, precision=precision,
                         learning_rate=learning_rate, xla=xla,
                         steps_per_call=steps_per_call)
    runtime = dist.Runtime(rank=0, size=1, local_rank=0, hosts=1, hvd=None)
    return Trainer(config, runtime, train, (train[:8], train[8:16]), split_digest="x")


def test_the_loop_reads_the_device_once_per_call_of_many_steps(tmp_path, monkeypatch) -> None:
    trainer = make_trainer(tmp_path, steps=10, precision="mixed_float16", steps_per_call=4)
    trainer._run_epoch(1, broadcast_after_first=False)  # traced and warm
    reads: list[str] = []
    for name in READS:
        original = getattr(ops._EagerTensorBase, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(ops._EagerTensorBase, name, counted)
    record = trainer._run_epoch(2, broadcast_after_first=False)
    # 10 steps in calls of 4, 4 and 2, each read once, plus the epoch's loss scale for the log
    assert len(reads) == 3 + 1, reads
    assert record["step"] == 20 and np.isfinite(record["loss"]) and record["skipped_steps"] >= 0


def test_a_non_finite_loss_is_named_by_its_step_when_the_call_is_read(tmp_path) -> None:
    trainer = make_trainer(tmp_path, steps=6, learning_rate=1e38, steps_per_call=4)
    with pytest.raises(VaecfError, match=r"non-finite loss at epoch 1 step 2 \(seen at step 4"):
        trainer._run_epoch(1, broadcast_after_first=False)


class CountingHorovod:
    """Horovod (a real world of one) that counts the collectives a traced step issues."""

    def __init__(self) -> None:
        import horovod.tensorflow as hvd

        hvd.init()
        self.hvd, self.grouped, self.single = hvd, [], 0

    def __getattr__(self, name: str):
        return getattr(self.hvd, name)

    def grouped_allreduce(self, tensors, **kwargs):
        self.grouped.append(len(tensors))
        return self.hvd.grouped_allreduce(tensors, **kwargs)

    def allreduce(self, tensor, **kwargs):
        self.single += 1
        return self.hvd.allreduce(tensor, **kwargs)


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_one_grouped_allreduce_per_step_carries_gradients_and_statistics(
        tmp_path, compression: str) -> None:
    trainer = make_trainer(tmp_path, steps=3)
    hvd = CountingHorovod()
    runtime = dist.Runtime(rank=0, size=2, local_rank=0, hosts=1, hvd=hvd)
    config = dataclasses.replace(trainer.config, compression=compression)
    step = lone_step(trainer.model, trainer.optimizer, config, runtime)
    batch = gathered(trainer.maker, np.arange(8, dtype=np.int64)[np.newaxis])[0]
    for i in range(3):
        stats = step(batch, tf.constant(i, tf.int64)).numpy()
        assert stats.shape == (5,) and np.isfinite(stats).all()
    # one trace, holding one grouped allreduce of every gradient and the statistics
    assert hvd.grouped == [len(trainer.model.trainable_variables) + 1] and hvd.single == 0


def test_xla_compiles_the_step_once_per_epoch_size_not_per_batch(tmp_path) -> None:
    trainer = make_trainer(tmp_path, steps=8, xla=True)
    sizes, per_batch = set(), set()
    for epoch in (1, 2, 3):
        everyone = data.all_ranks_users(64, seed=0, epoch=epoch, steps=8, batch_size=8,
                                        world_size=1)
        sizes |= set(trainer.maker.padded_sizes(everyone).tolist())
        per_batch |= set(data.BatchMaker(trainer.train, 4).padded_sizes(everyone).tolist())
        trainer._run_epoch(epoch, broadcast_after_first=False)
    assert len(per_batch) >= 5  # padded per batch, the step would compile this many times
    # the call is traced (and XLA-compiled) once per padded size it sees, whatever its steps
    assert trainer.calls["joint"].experimental_get_tracing_count() == len(sizes) <= 3


def test_a_signal_after_the_checkpoint_decision_stops_the_next_epoch_with_its_checkpoint(
        tmp_path, monkeypatch) -> None:
    """SIGTERM landing between the epoch's checkpoint decision and its stop check (a slow
    host) once stopped the run with no checkpoint of the epoch it named."""
    import os
    import signal

    from vaecf.train import checkpoint

    trainer = make_trainer(tmp_path, steps=2)
    trainer.config = dataclasses.replace(trainer.config, epochs=3)
    decided: list[int] = []

    def due_then_signalled(epoch: int, saved: float) -> bool:
        decided.append(epoch)
        if epoch == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the real signal, at the racy moment
        return False

    monkeypatch.setattr(trainer, "_checkpoint_due", due_then_signalled)
    with pytest.raises(VaecfError, match=r"^stopped by SIGTERM after epoch 2 \(step 4\)"):
        trainer.fit()
    assert checkpoint.list_checkpoints(str(tmp_path)) == ["epoch-000002"]
    assert decided == [1]  # epoch 2 was due because of the signal, not the interval
