"""Early stopping (``vaecf train`` without ``--epochs``): the loop stops once the validation
NDCG@100 has not improved for ``patience`` epochs, checkpoints there, and a rerun resumes to the
same stop instead of training on."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import scipy.sparse as sp

from vaecf.train import checkpoint
from vaecf.train import horovod as dist
from vaecf.train import trainer as trainer_module
from vaecf.train.config import TrainConfig
from vaecf.train.tracking import VAL_KEYS
from vaecf.train.trainer import Trainer

# validation NDCG@100 of epochs 1, 2, ...: best at epoch 2, then no gain for epochs 3 and 4
SCORES = [0.10, 0.30, 0.20, 0.25, 0.90, 0.95, 0.99]


def make_trainer(tmp_path, monkeypatch, **change: Any) -> tuple[Trainer, list[int]]:
    """A tiny trainer whose epochs do no work and whose validation reads ``SCORES``."""
    rng = np.random.default_rng(0)
    train = sp.random(32, 20, density=0.2, format="csr", random_state=rng, dtype=np.float32)
    train.data[:] = 1.0
    config = TrainConfig(split="", output="", checkpoint_dir=str(tmp_path), batch_size=8,
                         hidden=8, latent=4, encoder_layers=1, checkpoint_interval=1e9,
                         **change)
    runtime = dist.Runtime(rank=0, size=1, local_rank=0, hosts=1, hvd=None)
    trainer = Trainer(config, runtime, train, (train[:8], train[8:16]), split_digest="x")
    ran: list[int] = []

    def run_epoch(epoch: int, broadcast_after_first: bool) -> dict[str, Any]:
        ran.append(epoch)
        return {"epoch": epoch, "loss": 0.0, "nll": 0.0, "kl": 0.0, "beta": 0.0,
                "users_per_second": 1.0, "input_share": 0.0}

    def scripted(*_: Any, **__: Any) -> SimpleNamespace:
        value = SCORES[len(trainer.state.log)]
        return SimpleNamespace(metrics={key: SimpleNamespace(mean=value, stderr=0.01)
                                        for key in VAL_KEYS})

    monkeypatch.setattr(trainer, "_run_epoch", run_epoch)
    monkeypatch.setattr(trainer_module, "evaluate", scripted)
    return trainer, ran


def test_without_epochs_training_stops_after_patience_epochs_without_a_gain(
        tmp_path, monkeypatch) -> None:
    trainer, ran = make_trainer(tmp_path, monkeypatch, patience=2, max_epochs=7)
    trainer.fit()
    assert ran == [1, 2, 3, 4]  # epochs 3 and 4 did not beat epoch 2's 0.30
    assert (trainer.state.epoch, trainer.state.best_epoch) == (4, 2)
    assert trainer.state.best_ndcg == 0.30
    # the stop is checkpointed, so a rerun (e.g. after a failed publish) finds where it stopped
    assert checkpoint.load_newest(str(tmp_path)).name == "epoch-000004"

    again, ran_again = make_trainer(tmp_path, monkeypatch, patience=2, max_epochs=7)
    again.restore()
    again.fit()
    assert ran_again == [] and (again.state.epoch, again.state.best_epoch) == (4, 2)


def test_only_a_validated_epoch_can_stop_the_run(tmp_path, monkeypatch) -> None:
    """With --validate-every 2 and --patience 3, epoch 5 is 3 epochs past the best (epoch 2)
    but nobody saw its score: the run goes on, and epoch 6's validation finds a gain."""
    trainer, ran = make_trainer(tmp_path, monkeypatch, patience=3, validate_every=2,
                                max_epochs=7)
    trainer.fit()
    assert ran == [1, 2, 3, 4, 5, 6, 7] and trainer.state.best_epoch == 7


def test_a_longer_patience_trains_on_and_the_cap_ends_the_run(tmp_path, monkeypatch) -> None:
    trainer, ran = make_trainer(tmp_path, monkeypatch, patience=3, max_epochs=6)
    trainer.fit()
    assert ran == [1, 2, 3, 4, 5, 6] and trainer.state.best_epoch == 6


def test_epochs_trains_exactly_that_many_whatever_the_patience(tmp_path, monkeypatch) -> None:
    trainer, ran = make_trainer(tmp_path, monkeypatch, epochs=5, patience=1)
    trainer.fit()
    assert ran == [1, 2, 3, 4, 5] and trainer.state.best_epoch == 5


def test_default_annealing_reaches_the_cap_at_the_last_epoch_allowed() -> None:
    stopping = TrainConfig("s", "o", "c", max_epochs=30, beta_cap=0.2).resolved(10)
    fixed = TrainConfig("s", "o", "c", epochs=30, beta_cap=0.2).resolved(10)
    assert stopping.anneal_steps == fixed.anneal_steps == int((30 * 10 - 1) / 0.2)
