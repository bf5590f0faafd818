"""Checkpoints: written atomically, verified on read, newest valid one resumed.

A checkpoint ``epoch-000007`` holds ``state.npz`` (model weights, optimizer variables -- Adam
slots, iteration count and, under float16, the loss scale -- and the weights of the best epoch
so far) and ``meta.json`` (epoch, global step, best epoch and its NDCG@100, the train log so
far, the RNG state, the parameters, and the SHA-256 of ``state.npz``).

Atomicity: locally, both files are written into a hidden temporary directory that is renamed
into place; on S3, ``meta.json`` is uploaded last and acts as the commit marker. A checkpoint
whose ``meta.json`` is missing, unreadable or whose checksum does not match is corrupt and
skipped in favour of the previous one. The newest ``KEEP`` checkpoints are kept.
``sigterm_flag`` lets the trainer finish its epoch and checkpoint when Kubernetes stops a pod.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vaecf import log
from vaecf.errors import VaecfError
from vaecf.io import sha256_file, storage

KEEP = 3
_NAME = re.compile(r"^epoch-(\d{6})$")


@dataclass
class Checkpoint:
    """A loaded checkpoint: ``arrays`` keyed ``model/<i>``, ``optimizer/<i>``, ``best/<i>``."""

    name: str
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]


def _name(epoch: int) -> str:
    return f"epoch-{epoch:06d}"


def list_checkpoints(directory: str) -> list[str]:
    """Checkpoint names in ``directory``, newest first (corrupt ones included)."""
    if storage.is_s3(directory):
        names = {key.split("/", 1)[0] for key in storage.list_keys(directory)}
    else:
        path = Path(directory)
        names = {p.name for p in path.iterdir()} if path.is_dir() else set()
    return sorted((n for n in names if _NAME.match(n)), reverse=True)


def save(directory: str, epoch: int, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> str:
    """Write checkpoint ``epoch`` atomically, then drop all but the newest ``KEEP``."""
    name = _name(epoch)
    with tempfile.TemporaryDirectory(prefix="vaecf-ckpt-") as tmp:
        staging = Path(tmp) / name
        staging.mkdir()
        np.savez(staging / "state.npz", **arrays)
        meta = {**meta, "epoch": epoch, "state_sha256": sha256_file(staging / "state.npz")}
        (staging / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
        if storage.is_s3(directory):
            base = f"{directory.rstrip('/')}/{name}"
            storage.upload_file(staging / "state.npz", f"{base}/state.npz")
            storage.upload_file(staging / "meta.json", f"{base}/meta.json")  # commit marker
        else:
            _move_into_place(staging, Path(directory) / name)
    for old in list_checkpoints(directory)[KEEP:]:
        _delete(directory, old)
    return name


def _move_into_place(staging: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    hidden = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    shutil.move(str(staging), hidden / "c")  # may cross file systems: copy, then rename
    if target.exists():  # rewriting an epoch (a resumed run that got no further)
        shutil.rmtree(target)
    os.rename(hidden / "c", target)
    hidden.rmdir()


def _delete(directory: str, name: str) -> None:
    if storage.is_s3(directory):
        base = f"{directory.rstrip('/')}/{name}"
        storage.delete_keys(base, ["meta.json", "state.npz"])  # marker first
    else:
        shutil.rmtree(Path(directory) / name, ignore_errors=True)


def load_newest(directory: str) -> Checkpoint | None:
    """The newest valid checkpoint, or None; corrupt ones are reported and skipped."""
    for name in list_checkpoints(directory):
        try:
            return _load(directory, name)
        except (OSError, ValueError, KeyError, VaecfError) as err:
            log.info(f"checkpoint {directory}/{name} is unusable ({err}); trying the previous")
    return None


def _load(directory: str, name: str) -> Checkpoint:
    with tempfile.TemporaryDirectory(prefix="vaecf-ckpt-") as tmp:
        local = Path(tmp)
        if storage.is_s3(directory):
            base = f"{directory.rstrip('/')}/{name}"
            storage.download_file(f"{base}/meta.json", local / "meta.json")
            storage.download_file(f"{base}/state.npz", local / "state.npz")
        else:
            local = Path(directory) / name
        meta = json.loads((local / "meta.json").read_text())
        if sha256_file(local / "state.npz") != meta["state_sha256"]:
            raise ValueError("state.npz does not match its SHA-256 in meta.json")
        with np.load(local / "state.npz") as state:
            arrays = {key: state[key] for key in state.files}
    return Checkpoint(name=name, meta=meta, arrays=arrays)


@contextlib.contextmanager
def sigterm_flag() -> Iterator[threading.Event]:
    """An event set by the first SIGTERM while inside (main thread only; elsewhere never set).

    The first SIGTERM also restores the previous handler, so a second one acts at once.
    """
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handle(signum: int, frame: Any) -> None:
        flag.set()  # nothing else here: printing could re-enter a print the signal interrupted
        signal.signal(signal.SIGTERM, previous or signal.SIG_DFL)

    signal.signal(signal.SIGTERM, handle)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGTERM, previous or signal.SIG_DFL)
