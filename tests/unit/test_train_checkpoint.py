"""Checkpoints: atomic, verified, newest valid one wins, a corrupt newest falls back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from vaecf.train import checkpoint


def meta(step: int) -> dict[str, object]:
    """What the trainer records besides the epoch (``Trainer.save_checkpoint``)."""
    return {"step": step, "log": [], "best_epoch": None, "best_ndcg": -1.0, "n_items": 3,
            "split_digest": "d", "world_size": 1, "parameters": {}}


def write(directory: Path, epoch: int) -> None:
    checkpoint.save(str(directory), epoch, meta(10 * epoch),
                    {"model/0": np.full(3, epoch, np.float32)})


def test_round_trip_and_newest_first(tmp_path: Path) -> None:
    for epoch in (1, 2):
        write(tmp_path, epoch)
    found = checkpoint.load_newest(str(tmp_path))
    assert found is not None and found.name == "epoch-000002"
    assert found.meta["epoch"] == 2 and found.meta["step"] == 20
    np.testing.assert_array_equal(found.arrays["model/0"], [2, 2, 2])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_corrupt_newest_falls_back_to_previous(tmp_path: Path) -> None:
    for epoch in (1, 2, 3):
        write(tmp_path, epoch)
    state = tmp_path / "epoch-000003" / "state.npz"
    state.write_bytes(state.read_bytes()[:-10] + b"0123456789")
    (tmp_path / "epoch-000002" / "meta.json").write_text("{not json")
    found = checkpoint.load_newest(str(tmp_path))
    assert found is not None and found.name == "epoch-000001"


def test_half_written_checkpoint_is_ignored(tmp_path: Path) -> None:
    write(tmp_path, 1)
    (tmp_path / "epoch-000002").mkdir()  # e.g. killed before meta.json
    (tmp_path / "epoch-000002" / "state.npz").write_bytes(b"partial")
    found = checkpoint.load_newest(str(tmp_path))
    assert found is not None and found.name == "epoch-000001"


def test_only_the_newest_three_are_kept(tmp_path: Path) -> None:
    for epoch in range(1, 6):
        write(tmp_path, epoch)
    assert checkpoint.list_checkpoints(str(tmp_path)) == [
        "epoch-000005", "epoch-000004", "epoch-000003"]
    meta = json.loads((tmp_path / "epoch-000005" / "meta.json").read_text())
    assert len(meta["state_sha256"]) == 64


def test_empty_or_missing_directory_has_no_checkpoint(tmp_path: Path) -> None:
    assert checkpoint.load_newest(str(tmp_path / "absent")) is None
    assert checkpoint.load_newest(str(tmp_path)) is None


def test_s3_checkpoints_round_trip(s3_bucket: str) -> None:
    uri = f"s3://{s3_bucket}/run/checkpoints"
    for epoch in (1, 2):
        checkpoint.save(uri, epoch, meta(epoch), {"model/0": np.arange(4.0)})
    found = checkpoint.load_newest(uri)
    assert found is not None and found.name == "epoch-000002" and found.meta["step"] == 2
    np.testing.assert_array_equal(found.arrays["model/0"], np.arange(4.0))
