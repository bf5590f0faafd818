"""``<stage>_manifest.json``: the contract between stages.

A manifest records inputs, parameters, seed, counts, every output file with its SHA-256 and
size, library versions, and (under ``run``) wall time. Everything except ``run`` is a pure
function of the stage's inputs and parameters, so a rerun gives an identical manifest there.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import vaecf
from vaecf.errors import VaecfError
from vaecf.io import storage
from vaecf.io.paths import inside
from vaecf.io.readers import JSON_LIMIT, decode, field, parse_json, read_json

# Manifests named after what they describe rather than the stage that writes them.
_WRITER = {"dataset": "split"}
_VERSIONED = ("numpy", "pandas", "pyarrow", "scipy", "tensorflow", "keras", "horovod")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def versions() -> dict[str, str]:
    """Versions of Python, vaecf and the libraries this process has imported."""
    found = {"python": platform.python_version(), "vaecf": vaecf.__version__}
    for name in _VERSIONED:
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            found[name] = str(module.__version__)
    return found


def manifest_name(stage: str) -> str:
    return f"{stage}_manifest.json"


def write_manifest(directory: Path, stage: str, *, inputs: dict[str, Any],
                   parameters: dict[str, Any], counts: dict[str, Any],
                   started: float, extra: dict[str, Any] | None = None,
                   written: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Write ``<stage>_manifest.json`` describing every other file in ``directory``.

    Args:
      started: ``time.monotonic()`` when the stage started (for the wall time).
      extra: stage-specific fields that later stages read (e.g. the split's shapes).
      written: files of the output written elsewhere (the parts a cluster's tasks put in
        the S3 staging prefix), each with the ``sha256`` and ``bytes`` its writer measured.
    """
    name = manifest_name(stage)
    files = {
        path.relative_to(directory).as_posix(): {"sha256": sha256_file(path),
                                                  "bytes": path.stat().st_size}
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name != name
    }
    files = dict(sorted({**files, **(written or {})}.items()))
    manifest: dict[str, Any] = {
        "stage": stage,
        "inputs": inputs,
        "parameters": parameters,
        "counts": counts,
        **(extra or {}),
        "files": files,
        "versions": versions(),
        "run": {"wall_seconds": round(time.monotonic() - started, 3)},
    }
    (directory / name).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def require_listed(manifest: dict[str, Any], stage: str, where: Path | str,
                   names: Iterable[str]) -> None:
    """Each of ``names`` is a file ``manifest`` (the ``<stage>_manifest.json`` of the output at
    ``where``, a folder or an ``s3://`` prefix) lists: else one line naming the first that is
    not and asking whether ``where`` is that stage's output."""
    files = manifest["files"]
    for name in names:
        if name not in files:
            raise VaecfError(f"{where}/{name}: not listed in {manifest_name(stage)} "
                             f"({_origin(where, stage)})")


def _origin(where: Path | str, stage: str) -> str:
    return f"is {where} the output of 'vaecf {_WRITER.get(stage, stage)}'?"


def read_manifest(directory: Path, stage: str, required: Iterable[str] = (),
                  select: Callable[[dict[str, Any]], Iterable[str]] | None = None
                  ) -> dict[str, Any]:
    """Read and verify ``<stage>_manifest.json``: every listed file exists with its checksum.

    Args:
      required: files the caller reads, which the manifest must list (a manifest listing
        none of them would otherwise pass, and the read fail with a traceback).
      select: the listed files the caller reads, from the manifest: only these are verified
        (a training rank's share of a split; ``open_input`` fetched no other).
    """
    path = directory / manifest_name(stage)
    if not path.is_file():
        raise VaecfError(f"{path}: manifest missing ({_origin(directory, stage)})")
    manifest: dict[str, Any] = read_json(path)
    files = field(manifest, "files", str(path), "dict")
    for rel, entry in files.items():
        field(entry, "sha256", f"{path}: files: {rel}", "str")
    require_listed(manifest, stage, directory, required)
    checked = {rel: inside(directory, rel, str(path)) for rel in files}
    read = list(files) if select is None else list(select(manifest))
    require_listed(manifest, stage, directory, read)
    for rel in read:
        entry, file = files[rel], checked[rel]
        if not file.is_file():
            raise VaecfError(f"{file}: listed in {path.name} but missing")
        if sha256_file(file) != entry["sha256"]:
            raise VaecfError(f"{file}: SHA-256 does not match {path.name}")
    return manifest


def read_remote_manifest(uri: str, stage: str, required: Iterable[str] = ()
                         ) -> dict[str, Any]:
    """``read_manifest`` of a published ``s3://`` output read in place: its marker, its
    manifest and that every listed file is there, without reading the files. The caller
    checks their SHA-256 where they are read (a Spark engine's tasks: ``files_differ``)."""
    keys = set(storage.list_keys(uri))
    where = f"{uri.rstrip('/')}/{manifest_name(stage)}"
    if storage.SUCCESS_MARKER not in keys:
        raise VaecfError(f"{uri}: no {storage.SUCCESS_MARKER} marker (incomplete or "
                         "unpublished output)")
    if manifest_name(stage) not in keys:
        raise VaecfError(f"{where}: manifest missing ({_origin(uri, stage)})")
    manifest: dict[str, Any] = parse_json(decode(storage.read_object(where, JSON_LIMIT),
                                                 where), where)
    files = field(manifest, "files", where, "dict")
    for rel, entry in files.items():
        field(entry, "sha256", f"{where}: files: {rel}", "str")
        field(entry, "bytes", f"{where}: files: {rel}", "int")
    require_listed(manifest, stage, uri.rstrip("/"), required)
    missing = sorted(set(files) - keys)
    if missing:
        raise VaecfError(f"{uri.rstrip('/')}/{missing[0]}: listed in {manifest_name(stage)} "
                         "but missing")
    return manifest


def sha256_source(path: str | Path) -> tuple[str, int]:
    """SHA-256 (hex) and bytes of a local file or an ``s3://`` object, streamed."""
    digest, size = hashlib.sha256(), 0
    with storage.open_source(path) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size
