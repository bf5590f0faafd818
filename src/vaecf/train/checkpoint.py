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
from pathlib import Path
from typing import Any

import numpy as np

from vaecf import log
from vaecf.errors import VaecfError
from vaecf.io import sha256_file, storage
from vaecf.io.readers import field, read_json

KEEP = 3
_NAME = re.compile(r"^epoch-(\d{6})$")
OWN_FILES = frozenset({"meta.json", "state.npz"})  # what a checkpoint folder holds


@dataclass
class Checkpoint:
    """A loaded checkpoint: ``arrays`` keyed ``model/<i>``, ``optimizer/<i>``, ``best/<i>``."""

    name: str
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]


def _name(epoch: int) -> str:
    return f"epoch-{epoch:06d}"


def list_checkpoints(directory: str) -> list[str]:
    """Checkpoint names in ``directory``, newest first (corrupt ones included).

    A checkpoint is recognised by its own files: a folder ``epoch-NNNNNN`` holding
    ``meta.json`` and nothing but ``meta.json`` and ``state.npz`` (a user's folder that only
    shares the name is not one, and is never read or deleted).
    """
    if storage.is_s3(directory):
        found: dict[str, set[str]] = {}
        for key in storage.list_keys(directory):
            name, _, rest = key.partition("/")
            found.setdefault(name, set()).add(rest)
    else:
        path = Path(directory)
        found = {p.name: {f.name if f.is_file() and not f.is_symlink() else "" for f in
                          p.iterdir()}
                 for p in (path.iterdir() if path.is_dir() else [])
                 if _NAME.match(p.name) and p.is_dir() and not p.is_symlink()}
    return sorted((name for name, files in found.items()
                   if _NAME.match(name) and "meta.json" in files and files <= OWN_FILES),
                  reverse=True)


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
    happens, so a failed write leaves no ``.epoch-*`` debris, and the folders this write
    created (the first checkpoint's) are removed with it.
    """
    created = [p for p in (directory, *directory.parents) if not p.exists()]
    directory.mkdir(parents=True, exist_ok=True)
    try:
        _save_in(directory, name, meta, arrays, epoch)
    except BaseException:
        for folder in created:  # deepest first; only if still empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def _save_in(directory: Path, name: str, meta: dict[str, Any],
             arrays: dict[str, np.ndarray], epoch: int) -> None:
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
        folder = Path(directory) / name
        for file in OWN_FILES:  # only what a checkpoint holds (list_checkpoints checked)
            (folder / file).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()


def load_newest(directory: str) -> Checkpoint | None:
    """The newest valid checkpoint, or None; corrupt ones are reported and skipped."""
    for name in list_checkpoints(directory):
        try:
            return _load(directory, name)
        except (OSError, ValueError, VaecfError) as err:
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
        meta = read_json(local / "meta.json", f"{directory.rstrip('/')}/{name}/meta.json")
        check_meta(meta, f"{directory.rstrip('/')}/{name}/meta.json")
        if sha256_file(local / "state.npz") != meta["state_sha256"]:
            raise ValueError("state.npz does not match its SHA-256 in meta.json")
        try:
            with np.load(local / "state.npz", allow_pickle=False) as state:
                arrays = {key: state[key] for key in state.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
            raise VaecfError(f"{local / 'state.npz'}: not readable ({err})") from None
    return Checkpoint(name=name, meta=meta, arrays=arrays)


# meta.json field -> its kind (``vaecf.io.readers.field``): what resuming reads.
META_FIELDS = {"epoch": "int", "step": "int", "log": "list", "best_epoch": "int|none",
               "best_ndcg": "number", "state_sha256": "str", "parameters": "dict",
               "split_digest": "str", "n_items": "int", "world_size": "int|none"}


def check_meta(meta: dict[str, Any], where: str) -> None:
    """Every field resuming reads has its type (an edited ``meta.json`` is one line)."""
    for key, kind in META_FIELDS.items():
        field(meta, key, where, kind)
    for number, entry in enumerate(meta["log"]):
        field(entry, "epoch", f"{where}: log[{number}]", "int")
    if not (1 <= meta["epoch"] < 2**31 and 0 <= meta["step"] < 2**62):
        raise VaecfError(f"{where}: epoch {str(meta['epoch'])[:20]} and step "
                         f"{str(meta['step'])[:20]}: expected an epoch in 1 .. 2**31 - 1 and "
                         "a step in 0 .. 2**62 - 1")


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
