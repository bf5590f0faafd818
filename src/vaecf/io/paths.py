"""Paths built from data: an S3 key below a prefix, a manifest entry, an archive member.

Such a name comes from whoever wrote the data, not from the user: a key ``raw//home/u/.bashrc``
lies below the prefix ``raw/`` as ``/home/u/.bashrc``, and ``raw/../../etc/x`` climbs out of
it, and a name longer than the file system allows would fail half-way through a copy. Every
such name goes through ``inside`` (or ``relative_name``, for an archive member that
is never written under its own name) before anything is read or written, so that one rule
keeps every stage inside the folder it was given.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from vaecf.errors import VaecfError

NAME_MAX = 255  # bytes in one path component (Linux)


def relative_name(name: str, where: str) -> PurePosixPath:
    """``name`` as a relative path that stays inside its folder, or one line refusing it.

    Args:
      name: the path as the data gives it (``/`` separated).
      where: the folder, prefix, manifest or archive that gave it, for the message.
    """
    path = PurePosixPath(name)
    if "\0" in name or path.is_absolute() or ".." in path.parts or not path.parts:
        raise VaecfError(f"{where}: {name!r} is not a path inside its folder (empty, "
                         "absolute or climbing with '..'); refused, nothing read or written")
    longest = max(len(os.fsencode(part)) for part in path.parts)
    if longest > NAME_MAX:
        shown = f"{name[:60]!r}... ({len(name):,} characters)"
        raise VaecfError(f"{where}: {shown} has a name of {longest} bytes (at most "
                         f"{NAME_MAX}); refused, nothing read or written")
    return path


def inside(folder: Path, name: str, where: str) -> Path:
    """``folder / name``, refused unless it stays inside ``folder``, symbolic links followed.

    Raises:
      VaecfError: ``name`` is absolute, climbs with ``..``, or leads through a symbolic link
        (or a loop of them) out of ``folder``.
    """
    path = folder / relative_name(name, where)
    try:
        real, base = path.resolve(), folder.resolve()
    except (OSError, RuntimeError) as err:  # RuntimeError: a symbolic link loop (Python 3.11)
        raise VaecfError(f"{where}: {name!r} cannot be resolved ({err})") from None
    if base not in real.parents:
        raise VaecfError(f"{where}: {name!r} leads out of its folder through a symbolic link; "
                         "refused, nothing read or written")
    return path
