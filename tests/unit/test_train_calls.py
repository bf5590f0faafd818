"""Many training steps per call (``vaecf.train.calls``): the same weights for any steps per
call, and the lone step's weights (bit for bit under XLA; within a named bound without)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf
from single_steps import gathered, lone_step

from vaecf.train import calls, data
from vaecf.train import horovod as dist
from vaecf.train.config import TrainConfig
from vaecf.train.trainer import Trainer

RUNTIME = dist.Runtime(rank=0, size=1, local_rank=0, hosts=1, hvd=None)


def make_trainer(tmp_path, steps_per_call: int, **options) -> Trainer:
    rng = np.random.default_rng(0)
    train = sp.random(64, 30, density=0.2, format="csr", random_state=rng, dtype=np.float32)
    train.data[:] = 1.0
    config = TrainConfig(split="", output="", checkpoint_dir=str(tmp_path), batch_size=8,
                         epochs=2, hidden=8, latent=4, steps_per_call=steps_per_call,
                         **{"encoder_layers": 1} | options)
    return Trainer(config, RUNTIME, train, (train[:8], train[8:16]), split_digest="x")


def state(trainer: Trainer) -> list[np.ndarray]:
    return trainer.model.get_weights() + [np.asarray(v) for v in trainer.optimizer.variables]


def two_epochs(trainer: Trainer) -> list[np.ndarray]:
    for epoch in (1, 2):
        trainer._run_epoch(epoch, broadcast_after_first=epoch == 1)
    return state(trainer)


def lone_steps(trainer: Trainer) -> list[np.ndarray]:
    """Two epochs the way the loop ran before many steps per call: each batch gathered by
    the maker alone, then one call of the lone step (``train_step`` compiled alone)."""
    config, step = trainer.config, 0
    step_fns = {phase: lone_step(trainer.model, trainer.optimizer, config, RUNTIME, phase)
                for phase in dict.fromkeys(config.passes)}
    for epoch in (1, 2):
        for index, phase in enumerate(config.passes):
            everyone = data.all_ranks_users(trainer.n_users, seed=config.seed, epoch=epoch,
                                            steps=trainer.steps, batch_size=config.batch_size,
                                            world_size=1, pass_index=index)
            if phase == "decoder":
                trainer.model.update_prior()
            for batch in gathered(trainer.maker, everyone[:, 0],
                                  trainer.maker.padded_sizes(everyone)):
                step_fns[phase](batch, tf.constant(step, tf.int64))
                step += 1
        if config.passes == ("joint",):
            trainer.model.update_prior()
    return state(trainer)


def assert_same(ours: list[np.ndarray], theirs: list[np.ndarray]) -> None:
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert np.array_equal(a, b), (i, float(np.abs(a - b).max()))


@pytest.mark.parametrize("options", [
    {"steps_per_epoch": 8}, {"user_shares": 2},
    {"alternate": 3, "composite_prior": True, "implicit_slim_every": 1, "encoder_layers": 2},
    {"precision": "mixed_float16", "learning_rate": 1.0}],
    ids=["joint", "user-shares", "alternate", "float16"])
def test_the_weights_after_two_epochs_do_not_depend_on_the_steps_per_call(tmp_path,
                                                                         options) -> None:
    """One step per call, three, and the chosen counts (1, 2, 4, ... then measured) run the
    same program per step: the same weights and Adam moments, bit for bit (under XLA: the
    next test, where the chosen counts take the lone steps' weights)."""
    one = two_epochs(make_trainer(tmp_path, 1, **options))
    assert_same(two_epochs(make_trainer(tmp_path, 0, **options)), one)
    if options == {"steps_per_epoch": 8}:
        assert_same(two_epochs(make_trainer(tmp_path, 3, **options)), one)


def test_skipped_float16_steps_are_counted_across_calls(tmp_path) -> None:
    trainer = make_trainer(tmp_path, 3, precision="mixed_float16", learning_rate=1.0)
    trainer.optimizer.dynamic_scale.assign(2.0 ** 120)  # overflows until halved enough
    record = trainer._run_epoch(1, broadcast_after_first=False)
    assert record["skipped_steps"] >= 1 and record["step"] == trainer.steps


def test_under_xla_the_calls_take_the_lone_steps_bit_for_bit(tmp_path) -> None:
    """The chosen counts (1, 2, 4, 1 steps per call, then 8) against one step per call."""
    assert_same(two_epochs(make_trainer(tmp_path, 0, xla=True)),
                lone_steps(make_trainer(tmp_path, 0, xla=True)))


# Without XLA the lone step and the loop's body are the same ops, but Grappler's arithmetic
# optimizer (``tf.config.optimizer`` option ``arithmetic_optimization``) rewrites the two
# graphs differently (with it off they agree bit for bit): after two epochs here the
# weights differed by at most 3e-8 (2026-11-28, this CPU). A mistake in the loop (a step's
# batch, step index or KL weight) moves them by more than 1e-4.
LONE_STEP_BOUND = 1e-6


def test_without_xla_the_calls_take_the_lone_steps_within_the_bound(tmp_path) -> None:
    ours = two_epochs(make_trainer(tmp_path, 0))
    theirs = lone_steps(make_trainer(tmp_path, 0))
    worst = max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs, strict=True))
    assert worst <= LONE_STEP_BOUND


def test_the_chosen_calls_double_until_measured_then_last_a_quarter_second() -> None:
    sizer = calls.CallSizer(0, limit=100)
    assert [sizer.steps(50) for _ in range(4)] == [1, 2, 4, 8]
    sizer.measure(calls.CALL_SECONDS / 10)  # 10 steps per call
    assert sizer.steps(50) == 10 and sizer.steps(3) == 3  # never past the pass's end
    sizer.measure(1e-6)
    assert sizer.steps(500) == 100  # at most the limit
    sizer.measure(None)
    assert sizer.steps(500) == 100  # unmeasured: as before
    assert calls.CallSizer(7, limit=5).steps(50) == 5
