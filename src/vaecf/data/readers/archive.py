"""Find a dataset's data files inside what was downloaded: plain files, zips, tarballs.

Members are extracted to a scratch directory before parsing, so pyarrow reads a real file
with its own (multi-threaded, GIL-free) I/O, and a bad line can be re-read to name it. A
truncated or corrupt archive becomes one error naming the archive.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from vaecf.errors import VaecfError

Match = Callable[[str], bool]
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
_ARCHIVE_ERRORS = (zipfile.BadZipFile, tarfile.TarError, zlib.error, EOFError, OSError)


@dataclass(frozen=True)
class DataFile:
    """One data file ready to parse.

    Attributes:
      label: how errors name it, e.g. ``ml-20m.zip:ml-20m/ratings.csv``.
      path: a local file holding its bytes.
    """

    label: str
    path: Path


def find_data_files(directory: Path, names: list[str], match: Match,
                    scratch: Path) -> list[DataFile]:
    """Every file, or archive member, among ``names`` whose path satisfies ``match``.

    Args:
      directory: the download directory; ``names`` are file names in it (from its manifest).
      match: called with a member's path inside its archive (or a plain file's name).
      scratch: an empty directory that receives extracted members.

    Returns:
      Data files in sorted label order, so reading is deterministic.
    """
    found: list[DataFile] = []
    for name in sorted(names):
        path = directory / name
        try:
            if name.endswith(".zip"):
                found.extend(_from_zip(path, name, match, scratch))
            elif name.endswith(_TAR_SUFFIXES):
                with tarfile.open(path, "r|*") as tar:
                    found.extend(_from_tar(tar, name, match, scratch))
            elif match(name):
                found.append(DataFile(name, path))
        except _ARCHIVE_ERRORS as err:
            raise VaecfError(f"{path}: archive is corrupt or truncated ({err})") from None
    return sorted(found, key=lambda f: f.label)


def _from_zip(path: Path, name: str, match: Match, scratch: Path) -> Iterator[DataFile]:
    with zipfile.ZipFile(path) as archive:
        for member in sorted(archive.namelist()):
            if member.endswith("/") or not match(member):
                continue
            with archive.open(member) as stream:
                yield DataFile(f"{name}:{member}", _save(stream, scratch, f"{name}:{member}"))


def _from_tar(tar: tarfile.TarFile, label: str, match: Match,
              scratch: Path) -> Iterator[DataFile]:
    """Stream through a tarball once; nested ``.tar`` members (Netflix') are walked too."""
    for member in tar:
        if not member.isfile():
            continue
        stream = tar.extractfile(member)
        if stream is None:
            continue
        if member.name.endswith(".tar"):
            with tarfile.open(fileobj=stream, mode="r|") as inner:
                yield from _from_tar(inner, f"{label}:{member.name}", match, scratch)
        elif match(member.name):
            yield DataFile(f"{label}:{member.name}",
                           _save(stream, scratch, f"{label}:{member.name}"))


def _save(stream: IO[bytes], scratch: Path, label: str) -> Path:
    digest = hashlib.sha1(label.encode(), usedforsecurity=False).hexdigest()[:16]
    target = scratch / f"{digest}-{Path(label).name}"
    with open(target, "wb") as out:
        shutil.copyfileobj(stream, out, 1 << 22)
    return target
