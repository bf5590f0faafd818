"""Download a dataset's raw files into a directory and verify them.

The files land exactly as their publisher distributes them (the zip, the tar.gz): the
readers of ``vaecf preprocess`` understand the native formats, so nothing is unpacked or
rewritten here and the published checksum stays meaningful. ``synthetic`` is generated
instead, in MovieLens' ``ratings.csv`` format so that it exercises the same reader.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vaecf import log
from vaecf.data.datasets import Dataset, RemoteFile
from vaecf.data.fetch import DEFAULT_RETRY, RetryPolicy, fetch, source_name
from vaecf.errors import VaecfError
from vaecf.io import storage


@dataclass(frozen=True)
class SyntheticSize:
    """Shape of a generated dataset (``--synthetic-users``, ``--synthetic-items``, ``--seed``)."""

    n_users: int
    n_items: int
    seed: int


def md5_file(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_dataset(dataset: Dataset, source: str | None, directory: Path,
                     policy: RetryPolicy = DEFAULT_RETRY,
                     synthetic: SyntheticSize | None = None) -> list[dict[str, Any]]:
    """Fetch (or generate) ``dataset`` into ``directory`` and verify published checksums.

    Args:
      source: overrides the default URL: one file (any scheme), a local directory or an
        ``s3://`` prefix ending in ``/`` (e.g. Netflix' per-movie files). A file with the
        same name as a registry file is checked against that file's published MD5.
      synthetic: sizes and seed when ``dataset`` is ``synthetic``.

    Returns:
      One record per file written: ``name``, ``source``, ``bytes``, ``md5`` and
      ``expected_md5`` (null when the publisher gives none).
    """
    if dataset.name == "synthetic":
        if synthetic is None:
            raise VaecfError("synthetic dataset needs its sizes and seed")
        return [_generate(directory, synthetic)]
    if source is None:
        if dataset.requires_source:
            raise VaecfError(f"--source: required for dataset '{dataset.name}' ({dataset.note})")
        targets = [(remote.url, remote.name) for remote in dataset.files]
    else:
        targets = _expand_source(source)
    expected = {remote.name: remote for remote in dataset.files}
    return [_fetch_verified(uri, directory / name, expected.get(name), policy)
            for uri, name in targets]


def _expand_source(source: str) -> list[tuple[str, str]]:
    """``(uri, file name)`` pairs for a source that may be a directory or an S3 prefix."""
    if storage.is_s3(source) and source.endswith("/"):
        keys = [k for k in storage.list_keys(source) if "/" not in k and k != "_SUCCESS"]
        if not keys:
            raise VaecfError(f"{source}: no objects under this prefix")
        return [(source + key, key) for key in keys]
    local = Path(source.removeprefix("file://"))
    if "://" not in source.removeprefix("file://") and local.is_dir():
        files = sorted(p for p in local.iterdir() if p.is_file())
        if not files:
            raise VaecfError(f"{source}: source directory holds no files")
        return [(str(p), p.name) for p in files]
    return [(source, source_name(source))]


def _fetch_verified(uri: str, dest: Path, remote: RemoteFile | None,
                    policy: RetryPolicy) -> dict[str, Any]:
    fetch(uri, dest, policy)
    size = dest.stat().st_size
    md5 = md5_file(dest)
    expected_md5 = remote.md5 if remote else None
    expected_size = remote.size if remote else None
    if (expected_md5 and md5 != expected_md5) or (expected_size and size != expected_size):
        raise VaecfError(f"{uri}: checksum mismatch for {dest.name}: MD5 {md5}, "
                         f"{size:,} bytes; expected MD5 {expected_md5}, "
                         f"{expected_size or size:,} bytes (corrupt or wrong file)")
    if expected_md5:
        log.info(f"{dest.name}: MD5 {md5} matches the published checksum")
    return {"name": dest.name, "source": uri, "bytes": size, "md5": md5,
            "expected_md5": expected_md5}


def _generate(directory: Path, size: SyntheticSize) -> dict[str, Any]:
    from vaecf.data.synthetic import generate_ratings, write_ratings_csv

    if size.n_users < 1 or size.n_items < 2:
        raise VaecfError(f"--synthetic-users/--synthetic-items: need at least 1 user and 2 "
                         f"items, got {size.n_users} and {size.n_items}")
    frame = generate_ratings(size.n_users, size.n_items, size.seed)
    path = directory / "ratings.csv"
    write_ratings_csv(frame, path)
    log.info(f"synthetic: {len(frame):,} ratings of {size.n_users:,} users x "
             f"{size.n_items:,} items (seed {size.seed})")
    return {"name": path.name, "source": "generated", "bytes": path.stat().st_size,
            "md5": md5_file(path), "expected_md5": None}
