"""Where a stage may publish: the output-location rule, checked before any work and again
before the output is replaced.

A stage publishes only into a location that does not exist, an empty one, or a previous
output of the same stage: a folder or prefix that holds that stage's manifest and nothing the
manifest does not list (plus ``_SUCCESS`` on S3). Never into or over one of its inputs, a
parent of an input or a place inside one, the working directory or a parent of it, ``.``,
``..``, a bucket root, a file or a symbolic link. Anything else is refused with one line and
nothing is touched: a stage never deletes what it did not write.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from vaecf.errors import VaecfError
from vaecf.io import storage


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


def _check_local(output: str, manifest: str, inputs: list[str]) -> None:
    raw = local_path(output)
    if output.rstrip("/") in ("", ".", "..") or raw.name in ("", ".", ".."):
        raise _refuse(output, "'.', '..' and '/' are never a stage's output")
    if raw.is_symlink():
        raise _refuse(output, "is a symbolic link, not a stage output folder")
    real = raw.resolve()
    cwd = Path.cwd().resolve()
    if real == cwd or real in cwd.parents:
        raise _refuse(output, "is the working directory or a parent of it")
    for uri in inputs:
        source = local_path(uri).resolve()
        if real == source or real in source.parents:
            raise _refuse(output, f"would replace this stage's input {uri}")
        if source in real.parents:
            raise _refuse(output, f"lies inside this stage's input {uri}")
    anchor = next(p for p in real.parents if p.exists())
    if not real.exists() and not (anchor.is_dir() and os.access(anchor, os.W_OK | os.X_OK)):
        raise VaecfError(f"{output}: output is not writable ({anchor} is not a writable folder)")
    if real.exists():
        if not real.is_dir():
            raise _refuse(output, "exists and is not a folder")
        present = {p.relative_to(real).as_posix() for p in real.rglob("*") if not p.is_dir()}
        if present and not _is_previous_output(present, _local_manifest(real / manifest),
                                               frozenset({manifest})):
            raise _refuse(output, f"is not empty and not a previous output with {manifest} "
                          "(a stage replaces only its own output)")


def _local_manifest(path: Path) -> dict[str, object] | None:
    try:
        found: dict[str, object] = json.loads(path.read_text())
        return found
    except (OSError, ValueError):
        return None


def _is_previous_output(present: set[str], manifest: dict[str, object] | None,
                        extra: frozenset[str]) -> bool:
    """Whether ``present`` (relative file names) holds only what ``manifest`` lists + ``extra``."""
    files = manifest.get("files") if manifest is not None else None
    return isinstance(files, dict) and not present - set(files) - extra


def _check_s3(output: str, manifest: str, inputs: list[str]) -> None:
    bucket, key = storage.split_s3(output)
    if not key:
        raise _refuse(output, "a bucket root is never a stage's output (give a prefix)")
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
        with tempfile.TemporaryDirectory(prefix="vaecf-manifest-") as tmp:
            storage.download_file(f"{output.rstrip('/')}/{manifest}", Path(tmp) / manifest)
            found = _local_manifest(Path(tmp) / manifest)
    if not _is_previous_output(present, found, frozenset({manifest, storage.SUCCESS_MARKER})):
        raise _refuse(output, f"is not empty and not a previous output with {manifest} "
                      "(a stage replaces only its own output)")

