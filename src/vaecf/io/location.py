"""Where a stage may publish: the output-location rule, checked before any work and again
before the output is replaced.

A stage publishes only into a location that does not exist, an empty one, or a previous
output of the same stage: a folder or prefix that holds that stage's manifest and nothing the
manifest does not list (plus ``_SUCCESS`` on S3; locally, no symbolic link and no folder
without a listed file). Never into or over one of its inputs, a parent of an input or a place
inside one, the working directory or a parent of it, ``.``, ``..``, a bucket root, a file, a
symbolic link, a mount point (which cannot be replaced by a rename) or a place inside another
run's staging area. Anything else is refused with one line and nothing is touched: a stage
never deletes what it did not write.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from vaecf.errors import VaecfError
from vaecf.io import storage
from vaecf.io.paths import NAME_MAX
from vaecf.io.readers import JSON_LIMIT, decode, parse_json, read_json

PATH_MAX = 4096  # bytes in a path (Linux), of which the stage's own files need up to NAME_MAX
S3_KEY_MAX = 1024  # bytes in an S3 key
# The working areas of vaecf's own runs (publish.py, open_input): never an output's home.
VAECF_AREA = re.compile(r"\..+\.(staging|old)-[a-z0-9_]{8}|vaecf-(publish|input)-[0-9]+-.+",
                        re.DOTALL)
# The manifests that mark a stage's output (``vaecf.io.manifest.manifest_name`` of every
# stage that publishes one): a folder holding one is that stage's, a place inside it no one's.
STAGE_MANIFESTS = frozenset(f"{stage}_manifest.json" for stage in (
    "download", "preprocess", "dataset", "train", "evaluate", "report", "benchmark",
    "benchmark-serve", "recommend", "tune"))
# The working areas this process holds: a stage may publish other stages' outputs inside its
# own staging (``vaecf tune`` publishes each trial's model there); only another run's are off
# limits.
_HELD: set[Path] = set()


def check_output(output: str, manifest: str, inputs: Iterable[str | None] = ()) -> None:
    """Refuse ``output`` unless the stage that writes ``manifest`` may publish there.

    Args:
      output: the stage's ``--output`` (a path, ``file://`` URI or ``s3://`` prefix).
      manifest: the manifest file that marks this stage's outputs (``split``:
        ``dataset_manifest.json``).
      inputs: everything the stage reads (paths or URIs; ``None`` entries are ignored).
    """
    sources = [uri for uri in inputs if uri and (storage.is_s3(uri) or "://" not in uri
                                                 or uri.startswith("file://"))]
    if storage.is_s3(output):
        _check_s3(output, manifest, [uri for uri in sources if storage.is_s3(uri)])
    else:
        _check_local(output, manifest, [uri for uri in sources if not storage.is_s3(uri)])


def local_path(uri: str) -> Path:
    """The path of a local output or input given as a path or ``file://`` URI."""
    return Path(uri.removeprefix("file://"))


def _refuse(output: str, why: str) -> VaecfError:
    return VaecfError(f"{output}: {why}; nothing was written")


@contextmanager
def holding(area: Path) -> Iterator[None]:
    """While the block runs, ``area`` (a working area this process made) is its own."""
    real = area.resolve()
    _HELD.add(real)
    try:
        yield
    finally:
        _HELD.discard(real)


def resolved(path: Path, uri: str) -> Path:
    """``path.resolve()``, with a symbolic link loop refused in one line."""
    try:
        return path.resolve()
    except (OSError, RuntimeError) as err:  # RuntimeError: a symbolic link loop (Python 3.11)
        raise VaecfError(f"{uri}: cannot be resolved ({err})") from None


def _check_local(output: str, manifest: str, inputs: list[str]) -> None:
    raw = local_path(output)
    if output.rstrip("/") in ("", ".", "..") or raw.name in ("", ".", ".."):
        raise _refuse(output, "'.', '..' and '/' are never a stage's output")
    _check_length(output, Path(os.path.abspath(raw)))
    if raw.is_symlink():
        raise _refuse(output, "is a symbolic link, not a stage output folder")
    real = resolved(raw, output)
    _check_length(output, real)
    cwd = Path.cwd().resolve()
    if real == cwd or real in cwd.parents:
        raise _refuse(output, "is the working directory or a parent of it")
    for uri in inputs:
        source = resolved(local_path(uri), uri)
        if real == source or real in source.parents:
            raise _refuse(output, f"would replace this stage's input {uri}")
        if source in real.parents:
            raise _refuse(output, f"lies inside this stage's input {uri}")
    if any(VAECF_AREA.fullmatch(p.name) and p not in _HELD for p in (real, *real.parents)):
        raise _refuse(output, "lies inside the working area of another vaecf run")
    check_not_inside_output(output, real)
    anchor = next(p for p in real.parents if p.exists())
    if not real.exists() and not (anchor.is_dir() and os.access(anchor, os.W_OK | os.X_OK)):
        raise VaecfError(f"{output}: output is not writable ({anchor} is not a writable folder)")
    if real.exists():
        if not real.is_dir():
            raise _refuse(output, "exists and is not a folder")
        if os.path.ismount(real):
            raise _refuse(output, "is a mount point, which a stage cannot replace; mount the "
                          "folder above it and write below that (docker run -v "
                          "host/data:/data ... --output /data/out)")
        files, others = _local_contents(real, output)
        if (files or others) and not _is_previous_output(
                files, _local_manifest(real / manifest), frozenset({manifest}), others):
            raise _refuse(output, f"is not empty and not a previous output with {manifest} "
                          "(a stage replaces only its own output)")


def stage_manifests(folder: Path) -> list[str]:
    """The ``STAGE_MANIFESTS`` a local folder holds (none if it is no folder)."""
    return sorted(n for n in STAGE_MANIFESTS if (folder / n).is_file()) if folder.is_dir() \
        else []


def check_not_inside_output(uri: str, real: Path | None = None, shown: str = "") -> None:
    """Refuse a location inside a stage's output: a folder above it holds one of the
    ``STAGE_MANIFESTS`` (that output would then hold files its manifest does not list, and no
    stage could replace it again). ``real``: a local location, resolved; ``shown``: how the
    message names the location (default ``uri``)."""
    shown = shown or uri
    if storage.is_s3(uri):
        bucket, key = storage.split_s3(uri)
        for above in PurePosixPath(key).parents:
            prefix = "" if str(above) == "." else str(above)
            found = sorted(set(storage.list_names(f"s3://{bucket}/{prefix}"))
                           & STAGE_MANIFESTS)
            if found:
                raise _refuse(shown, f"lies inside s3://{bucket}/{prefix}, a stage's output "
                              f"(it holds {found[0]})")
        return
    for folder in (real or resolved(local_path(uri), uri)).parents:
        found = stage_manifests(folder)
        if found:
            raise _refuse(shown, f"lies inside {folder}, a stage's output (it holds "
                          f"{found[0]})")


def _check_length(output: str, real: Path) -> None:
    """Names the file system cannot hold fail here, before any work, not at the end."""
    longest = max((len(os.fsencode(part)) for part in real.parts), default=0)
    if longest > NAME_MAX:
        raise _refuse(output, f"has a name of {longest} bytes (at most {NAME_MAX})")
    if len(os.fsencode(str(real))) > PATH_MAX - NAME_MAX:
        raise _refuse(output, f"is a path of {len(os.fsencode(str(real)))} bytes (at most "
                      f"{PATH_MAX - NAME_MAX}, leaving room for the files inside)")


def _local_contents(real: Path, output: str) -> tuple[set[str], set[str]]:
    """Below ``real``: its regular files, and everything else (folders, symbolic links,
    special files), as relative names; a symbolic link is listed, never followed. A folder
    that cannot be listed is refused: what it holds is unknown, so it is not ours to replace."""
    def unreadable(err: OSError) -> None:
        raise _refuse(output, f"holds {err.filename}, which cannot be listed ({err.strerror})")

    files: set[str] = set()
    others: set[str] = set()
    for root, folders, names in os.walk(real, onerror=unreadable):
        for name in folders + names:
            path = Path(root) / name
            rel = path.relative_to(real).as_posix()
            (files if path.is_file() and not path.is_symlink() else others).add(rel)
    return files, others


def _local_manifest(path: Path) -> dict[str, object] | None:
    try:
        found: dict[str, object] = read_json(path)
        return found
    except VaecfError:  # not a manifest: a stage replaces only what one lists
        return None


def _is_previous_output(present: set[str], manifest: dict[str, object] | None,
                        extra: frozenset[str], others: set[str] | None = None) -> bool:
    """Whether ``present`` (relative file names) holds only what ``manifest`` lists + ``extra``,
    and ``others`` (local entries that are no regular file) only the folders of those files."""
    files = manifest.get("files") if manifest is not None else None
    folders = {parent.as_posix() for name in present for parent in PurePosixPath(name).parents}
    return (isinstance(files, dict) and not present - set(files) - extra
            and not (others or set()) - folders)


def _check_s3(output: str, manifest: str, inputs: list[str]) -> None:
    bucket, key = storage.split_s3(output)
    if not key:
        raise _refuse(output, "a bucket root is never a stage's output (give a prefix)")
    if {"", ".", ".."} & set(key.split("/")):  # S3 keeps them literally; some servers do not
        raise _refuse(output, "'.', '..' and '//' are never part of an S3 output prefix")
    if len(key.encode()) > S3_KEY_MAX - NAME_MAX:
        raise _refuse(output, f"is a prefix of {len(key.encode())} bytes (at most "
                      f"{S3_KEY_MAX - NAME_MAX}, leaving room for the keys below it)")
    check_not_inside_output(output)
    path = PurePosixPath(key)
    for uri in inputs:
        in_bucket, in_key = storage.split_s3(uri)
        source = PurePosixPath(in_key)
        if in_bucket != bucket:
            continue
        if path == source or path in source.parents:
            raise _refuse(output, f"would replace this stage's input {uri}")
        if source in path.parents:
            raise _refuse(output, f"lies inside this stage's input {uri}")
    present = set(storage.list_keys(output))
    if not present:
        return
    found = None
    if manifest in present:
        uri = f"{output.rstrip('/')}/{manifest}"
        try:  # in memory: a killed run leaves nothing in $TMPDIR
            found = parse_json(decode(storage.read_object(uri, JSON_LIMIT), uri), uri)
        except VaecfError:  # not a manifest: a stage replaces only what one lists
            found = None
    if not _is_previous_output(present, found, frozenset({manifest, storage.SUCCESS_MARKER})):
        raise _refuse(output, f"is not empty and not a previous output with {manifest} "
                      "(a stage replaces only its own output)")

