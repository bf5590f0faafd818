"""The model-size check of ``vaecf train``: parameter count and the memory comparison."""

from __future__ import annotations

import pytest

from vaecf.errors import VaecfError
from vaecf.train import memory


def test_parameter_count_is_the_built_models() -> None:
    from vaecf.model import MultVAE

    model = MultVAE(301, hidden=24, latent=8)  # 301 items are padded to 304
    model.build_variables()
    assert memory.parameters(301, 24, 8) == sum(int(w.size) for w in model.get_weights())
    assert memory.parameters(301, 24, 8) == 305 * 24 + 25 * 16 + 9 * 24 + 25 * 304


def test_parameter_count_of_recvae_encoders_is_the_built_models() -> None:
    """RecVAE's deeper encoder (blocks and LayerNorms) and the composite prior's frozen copy
    are counted: ``--encoder-layers`` must not slip past the size check."""
    import numpy as np

    from vaecf.model import MultVAE

    model = MultVAE(301, hidden=24, latent=8, encoder_layers=4, composite_prior=True)
    model.build_variables()
    trained = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert memory.parameters(301, 24, 8, encoder_layers=4) == trained
    frozen = sum(int(np.prod(w.shape)) for w in model.weights) - trained
    assert memory.encoder_parameters(301, 24, 8, 4) == frozen


def test_the_check_counts_the_encoder_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "available_bytes", lambda: memory.GIB)
    memory.check_fits(20_000, 600, 200, 500, None, encoder_layers=5)
    with pytest.raises(VaecfError, match=r"--hidden 1024 --latent 200 with 20,000 items: "
                                         r"training needs at least 1\.9 GiB of memory "
                                         r"\([\d,]+ parameters in 64 encoder layers"):
        memory.check_fits(20_000, 1_024, 200, 500, None, encoder_layers=64)
    with pytest.raises(VaecfError, match=r"more than the 2,147,483,647 this trainer"):
        memory.check_fits(300, 65_536, 200, 100, None, encoder_layers=64)


def test_available_memory_is_read_and_plausible() -> None:
    import os

    free = memory.available_bytes()
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert free is not None and 0 < free <= physical


def test_a_model_over_the_memory_is_refused_with_the_figures(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's free memory varies: pin it to 1 GiB to check the comparison."""
    monkeypatch.setattr(memory, "available_bytes", lambda: memory.GIB)
    memory.check_fits(20_000, 600, 200, 500, None)  # ML-20M's size: ~0.4 GiB
    with pytest.raises(VaecfError) as refused:
        memory.check_fits(20_000, 4_000, 200, 500, None)  # ~2.5 GiB
    assert str(refused.value) == (
        "--hidden 4000 --latent 200 with 20,000 items: training needs at least 2.5 GiB of "
        "memory (162,428,400 parameters with Adam's moments, and a step's activations), 1.0 "
        "GiB is available (use a smaller --hidden, --latent, --encoder-layers or --batch-size)")


def test_the_check_counts_the_logits_a_step_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A million items at batch 4,096: whole logits (and their gradient) are 32.8 GB, more
    than the parameters' 6.4 GB; the chunked likelihood holds one chunk of them at a time.
    A 16 GiB host refuses the whole step and takes the chunked one."""
    monkeypatch.setattr(memory, "available_bytes", lambda: 16 * memory.GIB)
    with pytest.raises(VaecfError, match=r"training needs at least 36\.5 GiB"):
        memory.check_fits(1_000_000, 200, 64, 4_096, None)
    memory.check_fits(1_000_000, 200, 64, 4_096, 4_096)
    assert memory.training_bytes(1_000_000, 200, 64, 4_096, 4_096) == (
        memory.parameters(1_000_000, 200, 64) * memory.BYTES_PER_PARAMETER + 4_096 * 4_096 * 8
        + 4_096 * (200 * 2 + 3 * 64) * 8)


def test_a_sharded_trainer_checks_its_shard_and_the_whole_batch(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The trainer checks what it will hold, before it builds the model: with --shard-items
    over 2 ranks, its half of the (padded) item layers and both ranks' rows, which the
    sharded step scores on every rank."""
    import types

    import numpy as np
    import scipy.sparse as sp

    from vaecf.train import horovod as dist
    from vaecf.train.config import TrainConfig
    from vaecf.train.trainer import Trainer

    checked = []

    def check_fits(*args, **options):
        checked.append(args)
        raise VaecfError("refused")

    monkeypatch.setattr(memory, "check_fits", check_fits)
    train = sp.csr_matrix(np.ones((64, 30), np.float32))  # 30 items, padded to 32
    config = TrainConfig(split="", output="", checkpoint_dir=str(tmp_path), batch_size=16,
                         hidden=8, latent=4, shard_items=True)
    hvd = types.SimpleNamespace(allgather=None)  # referenced, never called before the check
    for rank in (0, 1):
        runtime = dist.Runtime(rank=rank, size=2, local_rank=rank, hosts=1, hvd=hvd)
        with pytest.raises(VaecfError, match="refused"):
            Trainer(config, runtime, train, (train[:8], train[8:16]), split_digest="x")
    assert checked == [(16, 8, 4, 16, None)] * 2
