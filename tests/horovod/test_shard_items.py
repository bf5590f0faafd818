"""``--shard-items`` is exact: two ranks with item shards take the data-parallel model's steps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.horovod, pytest.mark.slow]

BIN = Path(sys.executable).parent


def test_sharded_steps_equal_the_unsharded_model(tmp_path: Path) -> None:
    """Four Adam steps (dropout, KL, L2, chunked sharded softmax) on 2 ranks: the same losses
    and weights as the data-parallel model, within float32 rounding (1e-6: sums in another
    order across shards)."""
    out = tmp_path / "steps.npz"
    script = Path(__file__).with_name("shard_steps.py")
    done = subprocess.run([str(BIN / "horovodrun"), "-np", "2", "--gloo", sys.executable,
                           str(script), str(out)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = np.load(out)
    np.testing.assert_allclose(result["shard_losses"], result["whole_losses"], rtol=1e-6)
    assert result["whole_losses"][0] != result["whole_losses"][-1]  # the steps moved
    assert result["shard_logits"].shape == result["whole_logits"].shape == (4, 40)
    np.testing.assert_allclose(result["shard_logits"], result["whole_logits"], rtol=1e-5,
                               atol=1e-5)
    n_weights = sum(key.startswith("whole/") for key in result.files)
    assert n_weights == 8
    for i in range(n_weights):
        np.testing.assert_allclose(result[f"shard/{i}"], result[f"whole/{i}"], rtol=1e-5,
                                   atol=1e-6, err_msg=f"weight {i}")
