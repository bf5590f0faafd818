"""Every flag that names a location, by its role, checked by one function before any work.

A stage registers each such flag with its ``Role`` (``vaecf.stages.location``); ``vaecf
<stage>`` then checks every one of them here before the stage body runs, so a flag added later
gets the same checks (and the same attacks in the tests) without anyone writing them again:

- every location: no NUL, no empty name; an ``s3://`` key without ``.``, ``..`` or ``//`` and
  short enough for the keys below it; a local path short enough for the file system, not a
  symbolic link loop and not in ``/proc``, ``/sys`` or ``/dev``;
- an input (a stage's output this stage reads) is an existing folder, an input file a regular
  file (``/dev/zero`` and a FIFO are not: they would be read without end);
- an output obeys the output-location rule of ``vaecf.io.location``;
- the side outputs (checkpoints, TensorBoard event files) lie apart from every input and
  output and from any stage's output, and hold only what vaecf writes there;
- a workspace (``vaecf demo --output``, which holds every stage's output) is never ``.``, the
  working directory or a parent of it.
"""

from __future__ import annotations

import enum
import os
import re
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from vaecf.errors import VaecfError
from vaecf.io import storage
from vaecf.io.location import (
    NAME_MAX,
    PATH_MAX,
    S3_KEY_MAX,
    STAGE_MANIFESTS,
    check_not_inside_output,
    check_output,
    local_path,
    resolved,
    stage_manifests,
)

# Pseudo file systems: nothing vaecf reads or writes lives there (``/dev/shm`` is a tmpfs).
_SPECIAL = (Path("/proc"), Path("/sys"), Path("/dev"))
_SPECIAL_OK = (Path("/dev/shm"),)
# What TensorFlow's summary writer names its files (and the profiler's plugin folder).
TENSORBOARD_FILE = re.compile(r"events\.out\.tfevents\.[^/]+")


class Role(enum.Enum):
    """What a location flag names, which decides how it is checked."""

    INPUT = "input"  # a stage's output this stage reads: a folder or s3:// prefix
    INPUT_FILE = "input file"  # one file this stage reads: path, file:// or s3:// object
    INPUT_ANY = "input folder or file"  # either (vaecf report --manifests)
    LOCAL_FILE = "local file"  # one local file (a template): read here, never on S3
    SOURCE = "source"  # download's source: also https://, a file or a folder
    OUTPUT = "output"  # what the stage publishes (vaecf.io.location)
    CHECKPOINTS = "checkpoints"  # vaecf train's checkpoint folder
    TENSORBOARD = "tensorboard"  # vaecf train's event files
    WORKSPACE = "workspace"  # a folder of stage outputs (vaecf demo --output)
    STORE = "store"  # an s3:// prefix an MPIJob reads and writes below


READS = (Role.INPUT, Role.INPUT_FILE, Role.INPUT_ANY, Role.LOCAL_FILE, Role.SOURCE)


@dataclass(frozen=True)
class Location:
    """A location flag's role, and what its check needs.

    Attributes:
      role: what the flag names.
      manifest: for an output, the manifest file that marks the stage's outputs.
      prefix: a value names a location only when it starts with this (``--space @file``);
        the prefix is not part of the location.
      derive: the value the stage uses from the parsed flags, when it is not the flag's own
        (a default derived from another flag, a list given another way); None: the flag's.
      holds: for a workspace, the names of what the stage writes in it (an existing
        workspace holds nothing else, bar vaecf's hidden working files).
      manifest_of: for an output whose manifest depends on another flag (``vaecf
        launch-sparkapp --stage``), that manifest from the parsed flags; ``manifest`` is then
        the default's.
    """

    role: Role
    manifest: str = ""
    prefix: str = ""
    derive: Callable[[Any], Any] | None = None
    holds: frozenset[str] = frozenset()
    manifest_of: Callable[[Any], str] | None = None

    def given(self, args: Any) -> Location:
        """This location as the parsed flags ``args`` make it (its manifest resolved)."""
        if self.manifest_of is None:
            return self
        return replace(self, manifest=self.manifest_of(args), manifest_of=None)


def values(location: Location, dest: str, args: Any) -> list[str]:
    """The locations a parsed flag names (none, one, or a list's)."""
    value = location.derive(args) if location.derive else getattr(args, dest, None)
    found = value if isinstance(value, list | tuple) else [value]
    names = [str(v) for v in found if v is not None]
    if location.prefix:
        names = [v[len(location.prefix):] for v in names if v.startswith(location.prefix)]
    return names


def check_locations(given: Iterable[tuple[str, Location, str]]) -> None:
    """Check every location a stage was given, by its role, before any work.

    Args:
      given: (flag, its ``Location``, one value it names) for every location flag given.
    """
    entries = list(given)
    for flag, _, value in entries:
        check_name(flag, value)
    inputs = [v for _, loc, v in entries if loc.role in READS]
    outputs = [v for _, loc, v in entries if loc.role is Role.OUTPUT]
    checkpoints = [v for _, loc, v in entries if loc.role is Role.CHECKPOINTS]
    for flag, location, value in entries:
        role = location.role
        if role is Role.LOCAL_FILE and "://" in value:
            raise VaecfError(f"{flag} {value}: expected a local file")
        if role in READS:
            _check_input(flag, value, role)
        elif role is Role.OUTPUT:
            check_output(value, location.manifest, inputs)
        elif role is Role.CHECKPOINTS:
            check_side_output(flag, value, inputs, outputs, _checkpoint_file)
        elif role is Role.TENSORBOARD:
            check_side_output(flag, value, inputs, outputs + checkpoints,
                              lambda rel: TENSORBOARD_FILE.fullmatch(rel) is not None)
        elif role is Role.WORKSPACE:
            _check_workspace(flag, value, location.holds)
        elif role is Role.STORE and not storage.is_s3(value):
            raise VaecfError(f"{flag} {value!r}: expected an s3:// prefix")


def _local(value: str) -> bool:
    return not storage.is_s3(value) and ("://" not in value or value.startswith("file://"))


def check_name(flag: str, value: str) -> None:
    """What every location must be, whatever its role: a name, not a pattern or a trick."""
    where = f"{flag} {value!r}" if len(value) <= 120 else f"{flag} {value[:60]!r}..."
    if not value.strip() or "\0" in value:
        raise VaecfError(f"{where}: expected a location (empty, or holds a NUL)")
    if storage.is_s3(value):  # the bucket's name is the stage's to check (storage.split_s3)
        key = value[len("s3://"):].partition("/")[2].strip("/")
        parts = value[len("s3://"):].rstrip("/").split("/")[1:]
        if {"", ".", ".."} & set(parts):  # S3 keeps them literally; some servers do not
            raise VaecfError(f"{where}: '.', '..' and '//' are never part of an S3 key")
        if len(key.encode()) > S3_KEY_MAX - NAME_MAX:
            raise VaecfError(f"{where}: a key of {len(key.encode())} bytes (at most "
                             f"{S3_KEY_MAX - NAME_MAX}, leaving room for the keys below it)")
        return
    if not _local(value):
        return
    path = Path(os.path.abspath(local_path(value)))
    longest = max((len(os.fsencode(part)) for part in path.parts), default=0)
    if longest > NAME_MAX:
        raise VaecfError(f"{where}: has a name of {longest} bytes (at most {NAME_MAX})")
    if len(os.fsencode(str(path))) > PATH_MAX - NAME_MAX:
        raise VaecfError(f"{where}: a path of {len(os.fsencode(str(path)))} bytes (at most "
                         f"{PATH_MAX - NAME_MAX})")
    dangling = next((p for p in (path, *path.parents) if p.is_symlink() and not p.exists()),
                    None)
    if dangling is not None:
        raise VaecfError(f"{where}: {dangling} is a symbolic link to nothing")
    real = resolved(path, f"{flag} {value}")
    for special in _SPECIAL:
        if (real == special or special in real.parents) and not any(
                ok == real or ok in real.parents for ok in _SPECIAL_OK):
            raise VaecfError(f"{where}: lies in {special}, a special file system vaecf "
                             "never reads or writes")


def _check_input(flag: str, value: str, role: Role) -> None:
    """A local input exists and is a folder (``INPUT``), a regular file (``INPUT_FILE``,
    ``LOCAL_FILE``) or either (``INPUT_ANY``, ``SOURCE``): never a device, a FIFO or a
    socket."""
    if not _local(value):
        return
    path = local_path(value)
    kind = "directory" if role is Role.INPUT else "file"
    if not path.exists():  # a name, never a pattern: 'ra?' is not 'raw'
        raise VaecfError(f"{value}: input {kind} does not exist")
    if role is Role.INPUT and not path.is_dir():
        raise VaecfError(f"{value}: input is not a directory ({flag})")
    if role is not Role.INPUT and not path.is_file() and not (
            role in (Role.INPUT_ANY, Role.SOURCE) and path.is_dir()):
        raise VaecfError(f"{value}: input is not a regular file ({flag})")


def _checkpoint_file(rel: str) -> bool:
    """What ``vaecf train`` writes in a checkpoint folder (``vaecf.train.checkpoint``): the
    checkpoints (under ``shard-<rank>/`` with ``--shard-items``), and the hidden folder a
    killed run was writing one in."""
    return re.fullmatch(r"(shard-\d+/)?(epoch-\d{6}|\.epoch-\d{6}\.[^/]+/(new|old))/"
                        r"(meta\.json|state\.npz)", rel) is not None


def _contains(outer: PurePosixPath, inner: PurePosixPath) -> bool:
    return outer == inner or outer in inner.parents


def _relation(flag: str, value: str, others: Iterable[tuple[str, str]]) -> None:
    """Refuse ``value`` if it is, holds or lies inside one of ``others`` ((what, uri))."""
    s3 = storage.is_s3(value)
    for what, other in others:
        if storage.is_s3(other) != s3 or not (s3 or _local(other)):
            continue
        if s3:
            bucket, key = storage.split_s3(value)
            other_bucket, other_key = storage.split_s3(other)
            if bucket != other_bucket:
                continue
            mine, theirs = PurePosixPath("/" + key), PurePosixPath("/" + other_key)
        else:
            mine = PurePosixPath(resolved(local_path(value), value))
            theirs = PurePosixPath(resolved(local_path(other), other))
        if _contains(mine, theirs) or _contains(theirs, mine):
            raise VaecfError(f"{flag} {value}: is, holds or lies inside the {what} {other} "
                             "(it goes in a folder of its own); nothing was written")


def check_side_output(flag: str, value: str, inputs: Iterable[str], outputs: Iterable[str],
                      own: Callable[[str], bool]) -> None:
    """Refuse a side output (checkpoints, event files) that is not its own folder.

    It lies apart from every input and output (neither is, holds nor lies inside the other),
    inside no stage's output (no folder above it holds a stage's manifest), and holds
    nothing but the files ``own`` recognises (relative names): a rerun adds to what an earlier
    run wrote, and nothing else of the user's is ever touched. A local folder must be
    creatable: a probe is created and removed in its nearest existing folder.
    """
    _relation(flag, value, [*(("input", v) for v in inputs),
                            *(("output", v) for v in outputs)])
    if storage.is_s3(value):
        _check_s3_side(flag, value, own)
        return
    path = Path(os.path.realpath(local_path(value)))
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise VaecfError(f"{flag} {value}: {existing} is not a folder; nothing was written")
    manifests = stage_manifests(path)
    if manifests:
        raise VaecfError(f"{flag} {value}: holds {manifests[0]}, a stage's output (it goes in "
                         "a folder of its own); nothing was written")
    check_not_inside_output(value, path, f"{flag} {value}")
    if existing == path:  # written into, never replaced: a mount point will do
        strangers = sorted(_strangers(path, own))
        if strangers:
            raise VaecfError(f"{flag} {value}: holds {strangers[0]}, which vaecf did not write "
                             "there (give an empty or new folder); nothing was written")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".vaecf-probe-", dir=existing))
    except OSError as err:
        raise VaecfError(f"{flag} {value}: cannot create a folder in {existing} "
                         f"({err.strerror}); nothing was written") from err


def _strangers(path: Path, own: Callable[[str], bool]) -> Iterable[str]:
    """What lies below ``path`` that ``own`` does not recognise (links never followed;
    folders are judged by the files in them, and vaecf's own hidden working folders pass)."""
    for root, folders, names in os.walk(path):
        for name in folders:
            if Path(root, name).is_symlink():
                yield Path(root, name).relative_to(path).as_posix()
        for name in names:
            file = Path(root, name)
            rel = file.relative_to(path).as_posix()
            if file.is_symlink() or not file.is_file() or not own(rel):
                yield rel


def _check_s3_side(flag: str, value: str, own: Callable[[str], bool]) -> None:
    if not storage.split_s3(value)[1]:
        raise VaecfError(f"{flag} {value}: a bucket root is never a folder of vaecf's (give "
                         "a prefix)")
    check_not_inside_output(value, shown=f"{flag} {value}")
    keys = storage.list_keys(value)
    manifests = sorted(STAGE_MANIFESTS & set(keys))
    if manifests:
        raise VaecfError(f"{flag} {value}: holds {manifests[0]}, a stage's output (it goes in "
                         "a folder of its own); nothing was written")
    strangers = [k for k in keys if not own(k)]
    if strangers:
        raise VaecfError(f"{flag} {value}: holds {strangers[0]}, which vaecf did not write "
                         "there (give an empty or new prefix); nothing was written")


def _check_workspace(flag: str, value: str, holds: frozenset[str]) -> None:
    """A folder of stage outputs: never ``.``, the working directory or a parent of it, nor a
    folder holding anything but ``holds`` (and vaecf's hidden ``.<name>.*`` working files)."""
    if storage.is_s3(value):
        if not storage.split_s3(value)[1]:
            raise VaecfError(f"{flag} {value}: a bucket root is never vaecf's (give a prefix)")
        check_not_inside_output(value, shown=f"{flag} {value}")
        _no_strangers(flag, value, {k.split("/", 1)[0] for k in storage.list_keys(value)},
                      holds)
        return
    raw = local_path(value)
    real = resolved(raw, value)
    cwd = Path.cwd().resolve()
    if value.rstrip("/") in ("", ".", "..") or real == cwd or real in cwd.parents:
        raise VaecfError(f"{flag} {value}: '.', '..', the working directory and its parents "
                         "are never vaecf's (give a folder of its own); nothing was written")
    if real.exists() and not real.is_dir():
        raise VaecfError(f"{flag} {value}: exists and is not a folder; nothing was written")
    if real.is_dir() and (os.path.ismount(real) or stage_manifests(real)):
        raise VaecfError(f"{flag} {value}: is a mount point or a stage's output, not a folder "
                         "of vaecf's own; nothing was written")
    check_not_inside_output(value, real, f"{flag} {value}")
    if real.is_dir():
        _no_strangers(flag, value, {p.name for p in real.iterdir()}, holds)


def _no_strangers(flag: str, value: str, names: set[str], holds: frozenset[str]) -> None:
    ours = {n for n in names if n in holds or any(n.startswith(f".{h}.") for h in holds)}
    strangers = sorted(names - ours)
    if strangers:
        raise VaecfError(f"{flag} {value}: holds {strangers[0]}, which vaecf did not write "
                         f"there (give a new or empty folder); nothing was written")
