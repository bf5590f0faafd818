"""Checkpoints: written atomically, verified on read, newest valid one resumed.

A checkpoint ``epoch-000007`` holds ``state.npz`` (model weights, optimizer variables -- Adam
slots, iteration count and, under float16, the loss scale -- and the weights of the best epoch
so far) and ``meta.json`` (epoch, global step, best epoch and its NDCG@100, the train log so
far, the RNG state, the parameters, and the SHA-256 of ``state.npz``).

Atomicity: locally, both files are written into a hidden temporary directory that is renamed
into place; on S3, ``meta.json`` is uploaded last and acts as the commit marker. A checkpoint
whose ``meta.json`` is missing, unreadable or whose checksum does not match is corrupt and
skipped in favour of the previous one. The newest ``KEEP`` checkpoints are kept.
``stop_request`` lets the trainer finish its epoch and checkpoint when Kubernetes stops a pod
(SIGTERM) or a user presses Ctrl-C (SIGINT).
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
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from vaecf import log
from vaecf.errors import VaecfError
from vaecf.io import sha256_file, storage
from vaecf.io.location import local_path

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


def check_directory(directory: str, split: str) -> None:
    """Refuse a checkpoint location that is not the checkpoints' own, before any work.

    Checkpoints go in a folder of their own: never the split or a place inside it, nor a
    folder that holds, or lies inside one that holds, a stage's manifest (a model, a split):
    that output would then hold files its manifest does not list, and the stages refuse it.
    A local folder must be creatable: a probe is created and removed in its nearest existing
    folder (``os.access`` says yes to root in ``/proc``, where nothing can be created, and
    the run would fail at its first checkpoint, an epoch later).
    """
    flag = f"--checkpoint-dir {directory}"
    if storage.is_s3(directory):
        _check_s3_directory(directory, split, flag)
        return
    path = Path(os.path.realpath(directory))
    if not storage.is_s3(split):
        source = Path(os.path.realpath(local_path(split)))
        if path == source or source in path.parents:
            raise VaecfError(f"{flag}: lies in the split {split} (checkpoints go in a "
                             "folder of their own)")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise VaecfError(f"{flag}: {existing} is not a directory")
    for folder in (existing, *existing.parents):
        manifests = sorted(p.name for p in folder.glob("*_manifest.json"))
        if manifests:
            raise VaecfError(f"{flag}: {folder} holds {manifests[0]}, a stage's output "
                             "(checkpoints go in a folder of their own)")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".vaecf-probe-", dir=existing))
    except OSError as err:
        raise VaecfError(f"{flag}: cannot create a folder in {existing} ({err.strerror})"
                         ) from err


def _check_s3_directory(directory: str, split: str, flag: str) -> None:
    """The S3 form of ``check_directory``: the prefix itself is listed, not its parents."""
    bucket, key = storage.split_s3(directory)
    if not key.strip("/"):
        raise VaecfError(f"{flag}: a bucket root is never a checkpoint folder (give a prefix)")
    if storage.is_s3(split):
        split_bucket, split_key = storage.split_s3(split)
        path, source = PurePosixPath(key), PurePosixPath(split_key)
        if split_bucket == bucket and (path == source or source in path.parents):
            raise VaecfError(f"{flag}: lies in the split {split} (checkpoints go in a "
                             "folder of their own)")
    manifests = sorted(k for k in storage.list_keys(directory)
                       if "/" not in k and k.endswith("_manifest.json"))
    if manifests:
        raise VaecfError(f"{flag}: holds {manifests[0]}, a stage's output (checkpoints go "
                         "in a folder of their own)")


def list_checkpoints(directory: str) -> list[str]:
    """Checkpoint names in ``directory``, newest first (corrupt ones included)."""
    if storage.is_s3(directory):
        names = {key.split("/", 1)[0] for key in storage.list_keys(directory)}
    else:
        path = Path(directory)
        names = {p.name for p in path.iterdir()} if path.is_dir() else set()
    return sorted((n for n in names if _NAME.match(n)), reverse=True)


def save(directory: str, epoch: int, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> str:
    """Write checkpoint ``epoch`` atomically, then drop all but the newest ``KEEP``.

    Raises:
      VaecfError: the checkpoint could not be written (a full disk): one line; nothing of it
        is left behind and the previous checkpoints are kept.
    """
    name = _name(epoch)
    try:
        if storage.is_s3(directory):
            with tempfile.TemporaryDirectory(prefix="vaecf-ckpt-") as tmp:
                _write(Path(tmp), meta, arrays, epoch)
                base = f"{directory.rstrip('/')}/{name}"
                storage.upload_file(Path(tmp) / "state.npz", f"{base}/state.npz")
                storage.upload_file(Path(tmp) / "meta.json", f"{base}/meta.json")  # marker
        else:
            _save_local(Path(directory), name, meta, arrays, epoch)
    except OSError as err:
        raise VaecfError(f"checkpoint {directory.rstrip('/')}/{name}: cannot write it "
                         f"({err.strerror or err}); the previous checkpoints are kept") from err
    for old in list_checkpoints(directory)[KEEP:]:
        _delete(directory, old)
    return name


def _write(folder: Path, meta: dict[str, Any], arrays: dict[str, np.ndarray], epoch: int) -> None:
    # np.savez's own archive, but closed at once when a write fails: np.savez leaves that to
    # the garbage collector, which prints a second ENOSPC traceback ("Exception ignored").
    with zipfile.ZipFile(folder / "state.npz", "w", allowZip64=True) as archive:
        for key, value in arrays.items():
            with archive.open(f"{key}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)
    meta = {**meta, "epoch": epoch, "state_sha256": sha256_file(folder / "state.npz")}
    (folder / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))


def _save_local(directory: Path, name: str, meta: dict[str, Any],
                arrays: dict[str, np.ndarray], epoch: int) -> None:
    """Write into a hidden folder beside the target, then rename it into place.

    Staging in the checkpoint folder itself (not ``$TMPDIR``) makes the rename atomic and puts
    a full disk's error where the checkpoint goes; the hidden folder is removed whatever
    happens, so a failed write leaves no ``.epoch-*`` debris.
    """
    directory.mkdir(parents=True, exist_ok=True)
    hidden = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=directory))
    try:
        (hidden / "new").mkdir()
        _write(hidden / "new", meta, arrays, epoch)
        target = directory / name
        if target.exists():  # rewriting an epoch (a resumed run that got no further)
            os.rename(target, hidden / "old")
        os.rename(hidden / "new", target)
    finally:
        shutil.rmtree(hidden, ignore_errors=True)


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


class StopRequest(threading.Event):
    """Set by the first SIGTERM or SIGINT; ``signal_name`` says which (``"SIGINT"``)."""

    signal_name = ""


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stop_request() -> Iterator[StopRequest]:
    """An event set by the first SIGTERM or SIGINT while inside (main thread only).

    Kubernetes stopping a pod (SIGTERM) and Ctrl-C (SIGINT) both end the run after its epoch,
    with a checkpoint. The first signal restores the previous handlers, so a second one acts
    at once (SIGINT then raises ``KeyboardInterrupt``, which ``vaecf train`` reports in one
    line). Installed even where SIGINT was ignored (a background job), as SIGTERM always is.
    """
    flag = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    def handle(signum: int, frame: Any) -> None:
        # nothing else here: printing could re-enter a print the signal interrupted
        flag.signal_name = signal.Signals(signum).name
        flag.set()
        restore()

    for sig in STOP_SIGNALS:
        signal.signal(sig, handle)
    try:
        yield flag
    finally:
        restore()
