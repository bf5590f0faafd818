"""Atomic publish of a stage's output directory, and local access to its inputs.

A stage writes into a staging directory; only when it finishes is the staging directory
renamed onto the output path (local) or uploaded with a final ``_SUCCESS`` marker (S3). A
stage that fails or is killed leaves its output location absent or complete, never partial.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from vaecf.errors import VaecfError
from vaecf.io import storage
from vaecf.io.location import check_output, local_path


@contextmanager
def publish(output: str, manifest: str, inputs: Iterable[str | None] = ()) -> Iterator[Path]:
    """Yield an empty staging directory; publish it to ``output`` if the block succeeds.

    ``output`` must satisfy the output-location rule (``vaecf.io.location``), checked before
    the block runs (so a refused or unwritable output fails before any work) and again just
    before a previous output is replaced. Concurrent publishers to one local output: the first
    holds a lock for the whole stage and the others fail at once with one line.

    Args:
      manifest: the manifest file that marks this stage's outputs.
      inputs: everything the stage reads, which the output may never replace or lie in.
    """
    sources = tuple(inputs)
    if storage.is_s3(output):
        storage.check_bucket(output)
    check_output(output, manifest, sources)
    if storage.is_s3(output):
        with _private_tmp("publish") as area:
            staging = area / "out"
            staging.mkdir()
            yield staging
            check_output(output, manifest, sources)
            storage.upload_dir(staging, output, first=manifest)
        return
    target = Path(os.path.abspath(local_path(output)))
    with _local_area(target, output) as area:
        staging = area / "out"
        staging.mkdir()
        yield staging
        check_output(output, manifest, sources)
        target.parent.mkdir(parents=True, exist_ok=True)
        _replace_dir(staging, target)


@contextmanager
def scratch(staging: Path) -> Iterator[Path]:
    """A scratch directory beside ``staging`` (never published), removed with it.

    It lives in the staging area, so even a killed stage's scratch (an archive's extracted
    members) is removed by the next run of the stage instead of filling ``$TMPDIR``.
    """
    with tempfile.TemporaryDirectory(prefix="scratch-", dir=staging.parent) as tmp:
        yield Path(tmp)


@contextmanager
def _local_area(target: Path, output: str) -> Iterator[Path]:
    """The locked staging area of ``target``, in its nearest existing ancestor folder.

    Staging beside the output makes the final rename atomic; it goes no higher than the
    nearest existing ancestor, so a failed run never creates the output's parent folders.
    Leftovers of a killed run of the same output (``.<name>.staging-*``, ``.<name>.old-*``)
    are removed once the lock is held: no live publisher of this output can own them.
    """
    anchor = target.parent
    while not anchor.is_dir():
        anchor = anchor.parent
    tag = "-".join(target.relative_to(anchor).parts)
    lock_path = anchor / f".{tag}.lock"
    try:
        lock = _lock(lock_path, output)
    except OSError as err:
        raise VaecfError(f"{output}: output is not writable ({err.strerror})") from err
    try:
        for stale in [*anchor.glob(f".{tag}.staging-*"), *anchor.glob(f".{tag}.old-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        try:
            area = Path(tempfile.mkdtemp(prefix=f".{tag}.staging-", dir=anchor))
        except OSError as err:
            raise VaecfError(f"{output}: output is not writable ({err.strerror})") from err
        try:
            yield area
        finally:
            shutil.rmtree(area, ignore_errors=True)
    finally:
        lock_path.unlink(missing_ok=True)
        os.close(lock)


def _lock(path: Path, output: str) -> int:
    """An exclusive, non-blocking lock on ``path``; one line if another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # The holder unlinks the file when done: a lock on an unlinked file guards nothing.
        if os.fstat(fd).st_ino != os.stat(path).st_ino:
            raise BlockingIOError
    except (BlockingIOError, FileNotFoundError):
        os.close(fd)
        raise VaecfError(f"{output}: another vaecf stage is writing this output now; "
                         "nothing was written") from None
    return fd


@contextmanager
def _private_tmp(kind: str) -> Iterator[Path]:
    """A ``$TMPDIR/vaecf-<kind>-<pid>-*`` directory; those of dead processes are removed."""
    root = Path(tempfile.gettempdir())
    for stale in root.glob(f"vaecf-{kind}-*-*"):
        pid = stale.name.split("-")[2]
        if pid.isdigit() and not pid_alive(int(pid)) and stale.stat().st_uid == os.getuid():
            shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=f"vaecf-{kind}-{os.getpid()}-") as tmp:
        yield Path(tmp)


@contextmanager
def process_tmp(kind: str) -> Iterator[Path]:
    """A private ``$TMPDIR/vaecf-<kind>-<pid>-*`` as this process's temporary directory.

    Everything the block writes through ``tempfile`` (TensorFlow's
    ``__autograph_generated_file*.py`` included) goes there and is removed at the end; what a
    killed process left is removed by the next one, as ``_private_tmp`` does.
    """
    with _private_tmp(kind) as tmp:
        previous, tempfile.tempdir = tempfile.tempdir, str(tmp)
        try:
            yield tmp
        finally:
            tempfile.tempdir = previous


def _replace_dir(staging: Path, target: Path) -> None:
    """Rename ``staging`` onto ``target``; an older ``target`` is moved aside first."""
    os.chmod(staging, 0o755)
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.rename(target, old / "x")
        os.rename(staging, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(staging, target)


def _local_input(uri: str, directory: bool) -> Path:
    """The local path of a non-S3 input (plain path or ``file://``), which must exist."""
    path = local_path(uri)
    if not (path.is_dir() if directory else path.is_file()):
        raise VaecfError(f"{uri}: input {'directory' if directory else 'file'} does not exist")
    return path


@contextmanager
def open_input(uri: str) -> Iterator[Path]:
    """A local directory holding the stage output at ``uri`` (downloaded if s3://)."""
    if not storage.is_s3(uri):
        yield _local_input(uri, directory=True)
        return
    with _private_tmp("input") as tmp:
        storage.download_dir(uri, tmp)
        with _named_as(tmp, uri):
            yield tmp


@contextmanager
def open_input_file(uri: str) -> Iterator[Path]:
    """A local path for one file given as a path, ``file://`` URI or ``s3://`` object."""
    if not storage.is_s3(uri):
        yield _local_input(uri, directory=False)
        return
    with _private_tmp("input") as tmp:
        dest = tmp / Path(storage.split_s3(uri)[1]).name
        storage.download_file(uri, dest)
        with _named_as(dest, uri):
            yield dest


@contextmanager
def _named_as(local: Path, uri: str) -> Iterator[None]:
    """Errors about the local copy ``local`` of ``uri`` name the ``s3://`` key instead."""
    try:
        yield
    except VaecfError as err:
        raise VaecfError(str(err).replace(str(local), uri.rstrip("/"))) from err


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (signal 0 probes without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
