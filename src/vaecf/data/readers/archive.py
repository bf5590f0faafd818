"""Find a dataset's data files inside what was downloaded: plain files, zips, tarballs.

Members are extracted to a scratch directory before parsing, so pyarrow reads a real file
with its own (multi-threaded, GIL-free) I/O, and a bad line can be re-read to name it. A
truncated or corrupt archive becomes one error naming the archive. ``peek_data_files``
walks the same members reading only their first line, so ``vaecf download`` can check that
the data files are there before a later stage needs them.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, TypeVar

from vaecf.errors import VaecfError
from vaecf.io.paths import inside, relative_name

Match = Callable[[str], bool]
T = TypeVar("T")
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
_ARCHIVE_ERRORS = (zipfile.BadZipFile, tarfile.TarError, zlib.error, EOFError, OSError)


@dataclass(frozen=True)
class DataFile:
    """One data file ready to parse.

    Attributes:
      label: how errors name it, e.g. ``ml-20m.zip:ml-20m/ratings.csv``.
      path: a local file holding its bytes, or an ``s3://`` object a Spark engine's tasks
        read in place (``vaecf.io.storage.open_source``).
    """

    label: str
    path: Path | str


@dataclass(frozen=True)
class _Member:
    """A matching plain file (read in place) or archive member (its opener is valid until
    the walk moves on)."""

    label: str
    source: Path | Callable[[], IO[bytes]]


def member_path(label: str) -> str:
    """The path of a labelled file inside its (innermost) archive, or the plain file's name."""
    return label.rsplit(":", 1)[-1]


def is_archive(name: str) -> bool:
    """A zip or tarball, which may hold data files whatever its own name."""
    return name.endswith((".zip", *_TAR_SUFFIXES))


def find_data_files(directory: Path, names: list[str], match: Match,
                    scratch: Path, archives: bool = True) -> list[DataFile]:
    """Every file, or archive member, among ``names`` whose path satisfies ``match``.

    Args:
      directory: the download directory; ``names`` are file names in it (from its manifest).
      match: called with a member's path inside its archive (or a plain file's name).
      scratch: an empty directory that receives extracted members.
      archives: look inside zips and tarballs (False: an archive is just a name ``match``
        does not take).

    Returns:
      Data files in sorted label order, so reading is deterministic.
    """
    def extract(member: _Member) -> DataFile:
        if isinstance(member.source, Path):
            return DataFile(member.label, member.source)
        with member.source() as stream:
            return DataFile(member.label, _save(stream, scratch, member.label))

    found = _scan(directory, names, match, extract, str(directory), archives)
    return sorted(found, key=lambda f: f.label)


def remote_data_files(uri: str, names: list[str], match: Match) -> list[DataFile]:
    """``find_data_files`` of a download published at ``uri`` (``s3://``) whose data files
    are plain files (``is_archive`` is false for all): each matching name as an object read
    in place, in sorted label order."""
    return [DataFile(name, f"{uri.rstrip('/')}/{relative_name(name, uri)}")
            for name in sorted(names) if match(name)]


def peek_data_files(directory: Path, names: list[str], match: Match, limit: int,
                    where: str, archives: bool = True) -> list[tuple[str, bytes]]:
    """The labels ``find_data_files`` would return, sorted, each with its first line (at
    most ``limit`` bytes), without extracting anything.

    Args:
      where: names the files' origin in errors (the download's source, not its staging).
    """
    def peek(member: _Member) -> tuple[str, bytes]:
        opened = member.source.open("rb") if isinstance(member.source, Path) else member.source()
        with opened as stream:
            return member.label, stream.readline(limit)

    return sorted(_scan(directory, names, match, peek, where, archives))


def _scan(directory: Path, names: list[str], match: Match, take: Callable[[_Member], T],
          where: str, archives: bool) -> list[T]:
    """``take`` applied to every matching member, inside the archive's error handling."""
    taken: list[T] = []
    paths = {name: inside(directory, name, where) for name in names}
    for name in sorted(names):
        path = paths[name]
        try:
            if archives and name.endswith(".zip"):
                taken.extend(take(m) for m in _from_zip(path, name, match))
            elif archives and name.endswith(_TAR_SUFFIXES):
                with tarfile.open(path, "r|*") as tar:
                    taken.extend(take(m) for m in _from_tar(tar, name, match))
            elif match(name):
                taken.append(take(_Member(name, path)))
        except _ARCHIVE_ERRORS as err:
            raise VaecfError(f"{where}: archive {name} is corrupt or truncated ({err})") from None
    return taken


def _from_zip(path: Path, name: str, match: Match) -> Iterator[_Member]:
    with zipfile.ZipFile(path) as archive:
        for member in sorted(archive.namelist()):
            if not member.endswith("/") and match(member):
                relative_name(member, f"{name}")
                yield _Member(f"{name}:{member}", partial(archive.open, member))


def _from_tar(tar: tarfile.TarFile, label: str, match: Match) -> Iterator[_Member]:
    """Stream through a tarball once; nested ``.tar`` members (Netflix') are walked too."""
    for member in tar:
        if not member.isfile():
            continue
        stream = tar.extractfile(member)
        if stream is None:
            continue
        if member.name.endswith(".tar"):
            with tarfile.open(fileobj=stream, mode="r|") as inner:
                yield from _from_tar(inner, f"{label}:{member.name}", match)
        elif match(member.name):
            relative_name(member.name, label)
            yield _Member(f"{label}:{member.name}", partial(_opened, stream))


def _opened(stream: IO[bytes]) -> IO[bytes]:
    """A streamed tarball's member can be read once, while the walk is on it."""
    return stream


def _save(stream: IO[bytes], scratch: Path, label: str) -> Path:
    digest = hashlib.sha1(label.encode(), usedforsecurity=False).hexdigest()[:16]
    target = scratch / f"{digest}-{Path(label).name}"
    with open(target, "wb") as out:
        shutil.copyfileobj(stream, out, 1 << 22)
    return target
