"""Atomic publish of a stage's output directory, and local access to its inputs.

A stage writes into a staging directory; only when it finishes is the staging directory
renamed onto the output path (local) or uploaded with a final ``_SUCCESS`` marker (S3). A
stage that fails or is killed leaves its output location absent or complete, never partial.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import string
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vaecf.errors import VaecfError
from vaecf.io import readers, storage
from vaecf.io.location import NAME_MAX, check_output, holding, local_path, resolved
from vaecf.io.locks import busy, lease, lock_file, lock_held, pid_alive
from vaecf.io.manifest import manifest_name, read_remote_manifest, require_listed
from vaecf.io.paths import inside

_TEMP_SUFFIX = "[a-z0-9_]{8}"  # what tempfile.mkdtemp appends
# A full disk or quota, a file too large, a read-only or failing device.
DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})
# The S3 staging prefix of each staging folder of an output bound for s3:// (remote_staging).
_REMOTE: dict[Path, str] = {}


@contextmanager
def publish(output: str, manifest: str, inputs: Iterable[str | None] = ()) -> Iterator[Path]:
    """Yield an empty staging directory; publish it to ``output`` if the block succeeds.

    ``output`` must satisfy the output-location rule (``vaecf.io.location``), checked before
    the block runs (so a refused or unwritable output fails before any work) and again just
    before a previous output is replaced. Concurrent publishers to one output: the first holds
    a lock (local) or a lease (S3) for the whole stage and the others fail at once with one
    line. A full disk, quota or failing device while the block writes is one line too.

    Args:
      manifest: the manifest file that marks this stage's outputs.
      inputs: everything the stage reads, which the output may never replace or lie in.
    """
    sources = tuple(inputs)
    if storage.is_s3(output):
        storage.check_bucket(output)
    check_output(output, manifest, sources)
    if storage.is_s3(output):
        with lease(output) as held, _private_tmp("publish") as area, holding(area):
            staging = area / "out"
            staging.mkdir()
            _REMOTE[staging] = remote = _remote_area(output)
            try:
                with _writing(output, f"$TMPDIR ({area})"):
                    yield staging
                held.check()
                check_output(output, manifest, sources)
                storage.upload_dir(staging, output, first=manifest, remote=f"{remote}/out")
            finally:
                del _REMOTE[staging]
                storage.delete_prefix(remote)
        return
    # The path the check resolved, symbolic links followed: ``l/../o`` is where ``l`` points
    # to, as the kernel reads it, not ``o`` beside ``l`` (``os.path.abspath``'s reading).
    target = resolved(local_path(output), output)
    with _local_area(target, output) as area:
        staging = area / "out"
        staging.mkdir()
        with _writing(output, str(area.parent)):
            yield staging
        _drop_empty_folders(staging)
        check_output(output, manifest, sources)
        target.parent.mkdir(parents=True, exist_ok=True)
        _replace_dir(staging, target, area.name.rsplit(".staging-", 1)[0])


def remote_staging(staging: Path) -> str | None:
    """The S3 staging prefix of ``staging`` (a ``publish`` block's folder) when the output
    is ``s3://``: where a cluster's tasks write the output's large files themselves (the
    parts of a Spark engine's output), published with the folder's files by a copy inside
    the store, removed on failure; None for a local output (the folder is the staging)."""
    area = _REMOTE.get(staging)
    return None if area is None else f"{area}/out"


def remote_scratch(staging: Path) -> str | None:
    """Beside ``remote_staging``, a prefix never published and removed with it: where the
    driver puts files a cluster's tasks must read that only it holds (an archive's members
    it extracted); None for a local output."""
    area = _REMOTE.get(staging)
    return None if area is None else f"{area}/scratch"


def _remote_area(output: str) -> str:
    """A new S3 staging prefix beside ``output``, ``.<name>.staging-<8 characters>`` (which
    the output-location rule keeps every stage out of); those a killed run of the same output
    left are removed first (the caller holds the output's lease: no live run owns them)."""
    bucket, key = storage.split_s3(output)
    parent, _, name = key.rpartition("/")
    start = f"{parent}/.{name}.staging-" if parent else f".{name}.staging-"
    debris = re.compile(re.escape(start) + f"({_TEMP_SUFFIX})/.*", re.DOTALL)
    stale = sorted({found.group(1) for k in storage.keys_starting(f"s3://{bucket}/{start}")
                    if (found := debris.fullmatch(k))})
    for token in stale:
        storage.delete_prefix(f"s3://{bucket}/{start}{token}")
    token = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    return f"s3://{bucket}/{start}{token}"


@contextmanager
def _writing(output: str, where: str) -> Iterator[None]:
    """An ``OSError`` the user fixes outside vaecf (``DISK_ERRORS``) becomes one line naming
    where the stage was writing; the staging area is removed as on any failure."""
    try:
        yield
    except OSError as err:
        if err.errno not in DISK_ERRORS:
            raise
        file = f", {err.filename}" if err.filename else ""
        raise VaecfError(f"{output}: {os.strerror(err.errno)} while writing in {where}{file}; "
                         "nothing was written") from err


@contextmanager
def scratch(staging: Path) -> Iterator[Path]:
    """A scratch directory beside ``staging`` (never published), removed with it.

    It lives in the staging area, so even a killed stage's scratch (an archive's extracted
    members) is removed by the next run of the stage instead of filling ``$TMPDIR``.
    """
    with tempfile.TemporaryDirectory(prefix="scratch-", dir=staging.parent) as tmp:
        yield Path(tmp)


def _tag(target: Path, anchor: Path) -> str:
    """``target`` relative to ``anchor`` as one file name, distinct for distinct targets.

    ``%`` and ``/`` are escaped (``p/a/b`` and ``p/a-b`` must not share a lock); a name that
    would leave no room for the longest suffix (``.staging-XXXXXXXX``) is hashed instead.
    """
    rel = target.relative_to(anchor).as_posix()
    tag = rel.replace("%", "%25").replace("/", "%2F")
    if len(os.fsencode(f".{tag}.staging-12345678")) > NAME_MAX:
        tag = "%h" + hashlib.sha256(os.fsencode(rel)).hexdigest()
    return tag


@contextmanager
def _local_area(target: Path, output: str) -> Iterator[Path]:
    """The locked staging area of ``target``, in its nearest existing ancestor folder.

    Staging beside the output makes the final rename atomic; it goes no higher than the
    nearest existing ancestor, so a failed run never creates the output's parent folders.
    Leftovers of a killed run of the same output (``.<name>.staging-*``, ``.<name>.old-*``,
    the name taken literally, never as a pattern) are removed once the lock is held: no live
    publisher of this output can own them.
    """
    anchor = target.parent
    while not anchor.is_dir():
        anchor = anchor.parent
    tag = _tag(target, anchor)
    lock_path = anchor / f".{tag}.lock"
    try:
        lock = lock_file(lock_path, output)
    except OSError as err:
        raise VaecfError(f"{output}: output is not writable ({err.strerror})") from err
    try:
        for higher in anchor.parents:  # where a run that began before the parents existed locked
            if lock_held(higher / f".{_tag(target, higher)}.lock"):
                raise busy(output)
        debris = re.compile(re.escape(f".{tag}.") + f"(staging|old)-{_TEMP_SUFFIX}", re.DOTALL)
        for stale in anchor.iterdir():
            if debris.fullmatch(stale.name) and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
        try:
            area = Path(tempfile.mkdtemp(prefix=f".{tag}.staging-", dir=anchor))
        except OSError as err:
            raise VaecfError(f"{output}: output is not writable ({err.strerror})") from err
        try:
            with holding(area):
                yield area
        finally:
            shutil.rmtree(area, ignore_errors=True)
    finally:
        lock_path.unlink(missing_ok=True)
        os.close(lock)


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


def _drop_empty_folders(staging: Path) -> None:
    """Remove the empty folders below ``staging`` (a SavedModel's empty ``assets/``).

    An output is its manifest's files and their folders, as on S3, which has no folders: an
    empty folder in a previous output means someone else put it there, so the next run refuses
    to replace it (``vaecf.io.location``). TensorFlow loads a SavedModel without ``assets/``.
    """
    for root, _, _ in os.walk(staging, topdown=False):  # children first: nested empties go too
        if root != str(staging) and not os.listdir(root):
            os.rmdir(root)


def _replace_dir(staging: Path, target: Path, tagged: str) -> None:
    """Rename ``staging`` onto ``target``; an older ``target`` is moved aside first (into
    ``<tagged>.old-*``, which the next run removes if this one is killed meanwhile)."""
    os.chmod(staging, 0o755)
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f"{tagged}.old-", dir=target.parent))
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
def open_input(uri: str, stage: str | None = None,
               select: Callable[[dict[str, Any]], Iterable[str]] | None = None
               ) -> Iterator[Path]:
    """A local directory holding the stage output at ``uri`` (downloaded if s3://).

    Args:
      stage, select: of an ``s3://`` output, download ``<stage>_manifest.json`` and only the
        listed files ``select(manifest)`` names (a training rank's share of a split), not the
        whole prefix; the reader verifies what it reads (``read_manifest``'s ``select``). A
        local output is read in place either way.
    """
    if not storage.is_s3(uri):
        yield _local_input(uri, directory=True)
        return
    with _private_tmp("input") as tmp:
        if stage is None or select is None:
            storage.download_dir(uri, tmp)
        else:
            manifest = read_remote_manifest(uri, stage)
            names = list(select(manifest))
            require_listed(manifest, stage, uri.rstrip("/"), names)
            # the manifest as read and chosen from, not fetched again (it could have changed)
            (tmp / manifest_name(stage)).write_text(json.dumps(manifest))
            for name in names:
                dest = inside(tmp, name, uri)
                dest.parent.mkdir(parents=True, exist_ok=True)
                storage.download_file(f"{uri.rstrip('/')}/{name}", dest)
        with _named_as(tmp, uri):
            yield tmp


@contextmanager
def open_input_file(uri: str) -> Iterator[Path]:
    """A local path for one file given as a path, ``file://`` URI or ``s3://`` object."""
    if not storage.is_s3(uri):
        yield _local_input(uri, directory=False)
        return
    with _private_tmp("input") as tmp:
        dest = inside(tmp, Path(storage.split_s3(uri)[1]).name, uri)
        storage.download_file(uri, dest)
        with _named_as(dest, uri):
            yield dest


def read_jsonl(uri: str) -> list[tuple[int, Any]]:
    """The JSON value of each non-blank line of ``uri`` (path, ``file://`` or ``s3://``), with
    its line number; a line that is not JSON is an error naming the file and the line."""
    with open_input_file(uri) as path:
        return readers.read_jsonl(path, uri)


def read_json(uri: str, expect: type | None = dict) -> Any:
    """The JSON value of ``uri`` (path, ``file://`` or ``s3://``), of type ``expect``."""
    with open_input_file(uri) as path:
        return readers.read_json(path, uri, expect)


@contextmanager
def _named_as(local: Path, uri: str) -> Iterator[None]:
    """Errors about the local copy ``local`` of ``uri`` name the ``s3://`` key instead."""
    try:
        yield
    except VaecfError as err:
        raise VaecfError(str(err).replace(str(local), uri.rstrip("/"))) from err
