"""Atomic publish of a stage's output directory, and local access to its inputs.

A stage writes into a staging directory; only when it finishes is the staging directory
renamed onto the output path (local) or uploaded with a final ``_SUCCESS`` marker (S3). A
stage that fails or is killed leaves its output location absent or complete, never partial.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vaecf.errors import VaecfError
from vaecf.io import storage


@contextmanager
def publish(output: str) -> Iterator[Path]:
    """Yield an empty staging directory; publish it to ``output`` if the block succeeds.

    The output location is checked (and the staging directory created) before the block
    runs, so an unwritable output fails before any work is done.
    """
    if storage.is_s3(output):
        storage.check_bucket(output)
        staging = Path(tempfile.mkdtemp(prefix="vaecf-publish-"))
    else:
        staging = _local_staging(Path(output))
    try:
        yield staging
        if storage.is_s3(output):
            storage.upload_dir(staging, output)
        else:
            _replace_dir(staging, Path(output))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _local_staging(target: Path) -> Path:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{target.name}.staging-", dir=target.parent))
    except OSError as err:
        raise VaecfError(f"{target}: output is not writable ({err.strerror})") from err


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
    path = Path(uri.removeprefix("file://"))
    if not (path.is_dir() if directory else path.is_file()):
        raise VaecfError(f"{uri}: input {'directory' if directory else 'file'} does not exist")
    return path


@contextmanager
def open_input(uri: str) -> Iterator[Path]:
    """A local directory holding the stage output at ``uri`` (downloaded if s3://)."""
    if not storage.is_s3(uri):
        yield _local_input(uri, directory=True)
        return
    with tempfile.TemporaryDirectory(prefix="vaecf-input-") as tmp:
        storage.download_dir(uri, Path(tmp))
        yield Path(tmp)


@contextmanager
def open_input_file(uri: str) -> Iterator[Path]:
    """A local path for one file given as a path, ``file://`` URI or ``s3://`` object."""
    if not storage.is_s3(uri):
        yield _local_input(uri, directory=False)
        return
    with tempfile.TemporaryDirectory(prefix="vaecf-input-") as tmp:
        dest = Path(tmp) / Path(storage.split_s3(uri)[1]).name
        storage.download_file(uri, dest)
        yield dest
