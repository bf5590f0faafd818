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


def test_available_memory_is_read_and_plausible() -> None:
    import os

    free = memory.available_bytes()
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert free is not None and 0 < free <= physical


def test_a_model_over_the_memory_is_refused_with_the_figures(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's free memory varies: pin it to 1 GiB to check the comparison."""
    monkeypatch.setattr(memory, "available_bytes", lambda: memory.GIB)
    memory.check_fits(20_000, 600, 200, 500)  # ML-20M's size: ~0.4 GiB
    with pytest.raises(VaecfError) as refused:
        memory.check_fits(20_000, 4_000, 200, 500)  # ~2.5 GiB
    assert str(refused.value) == (
        "--hidden 4000 --latent 200 with 20,000 items: training needs at least 2.5 GiB of "
        "memory (162,428,400 parameters with Adam's moments), 1.0 GiB is available (use a "
        "smaller --hidden, --latent or --batch-size)")
