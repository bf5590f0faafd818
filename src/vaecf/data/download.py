"""Download a dataset's raw files into a directory and verify them.

The files land exactly as their publisher distributes them (the zip, the tar.gz): the
readers of ``vaecf preprocess`` understand the native formats, so nothing is unpacked or
rewritten here and the published checksum stays meaningful. What was downloaded is then
checked to hold the data files the dataset's reader needs, in the layout the dataset is
published in (``inspect_download``), so a wrong or incomplete source fails here and not one
stage later. ``synthetic`` is generated instead, in MovieLens' ``ratings.csv`` format so that
it exercises the same reader.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vaecf import log
from vaecf.data.datasets import Dataset, RemoteFile, release_of
from vaecf.data.fetch import DEFAULT_RETRY, RetryPolicy, fetch, source_name
from vaecf.data.readers import READERS, Reader, TableColumns, check_data_files, layout_of
from vaecf.data.readers.archive import is_archive, peek_data_files
from vaecf.data.readers.interactions_table import probe_table
from vaecf.errors import VaecfError
from vaecf.io import storage
from vaecf.io.location import local_path
from vaecf.io.paths import inside

# Of each data file's first line: one byte more than the longest header a reader accepts,
# so that a longer one is refused as such.
_PEEK_BYTES = (64 << 10) + 1


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
        ``s3://`` prefix ending in ``/`` (e.g. Netflix' per-movie files). Of a directory or
        prefix, the data files and archives (if the dataset's reader opens them) are taken,
        in subfolders too, keeping their relative paths. A file with the same name as a
        registry file is checked against that file's published MD5.
      synthetic: sizes and seed when ``dataset`` is ``synthetic``.

    Returns:
      One record per file written: ``name``, ``source``, ``bytes``, ``md5`` and
      ``expected_md5`` (null when the publisher gives none).
    """
    if dataset.name == "synthetic":
        if synthetic is None:
            raise VaecfError("synthetic dataset needs its sizes and seed")
        return [_generate(directory, synthetic)]
    reader = READERS[dataset.reader]
    if source is None:
        if dataset.requires_source:
            raise VaecfError(f"--source: required for dataset '{dataset.name}' ({dataset.note})")
        targets = [(remote.url, remote.name) for remote in dataset.files]
    else:
        targets = _expand_source(source, reader)
    expected = {remote.name: remote for remote in dataset.files}
    where = source or "download"
    if not reader.archives:  # the names tell it all: check them before fetching
        names = [name for _, name in targets]
        check_data_files(dataset.reader, [n for n in names if reader.match(n)], names, where)
    dests = [(uri, name, inside(directory, name, where)) for uri, name in targets]
    return [_fetch_verified(uri, dest, name, expected.get(name), policy)
            for uri, name, dest in dests]


def verified_release(dataset: Dataset, records: list[dict[str, Any]]) -> str | None:
    """The GroupLens release these downloads are, if their published MD5 proved it; else None.

    A name or a zip folder proves nothing (any file can be called ``ml-20m.zip`` or sit in
    ``ml-1m/``): only the checksum does, so reports name a release from this alone.
    """
    proved = bool(records) and all(r["expected_md5"] and r["md5"] == r["expected_md5"]
                                   for r in records)
    return dataset.name if dataset.folder and proved else None


def inspect_download(dataset: Dataset, directory: Path, names: list[str],
                     where: str, columns: TableColumns | None = None) -> dict[str, Any]:
    """Check that the downloaded ``names`` hold what ``dataset`` is; describe what they hold.

    Args:
      where: the source as the user gave it, for messages.
      columns: for ``table``, the columns every data file must have.

    Returns:
      ``data_files`` (labels, e.g. ``ml-1m.zip:ml-1m/ratings.dat``), ``layout`` (MovieLens:
      ``ratings.csv``, ``ratings.dat`` or ``u.data``) and ``release`` (the GroupLens release
      whose zip folder holds the data, or null): recorded in the manifests.
    """
    reader = READERS[dataset.reader]
    peeked = peek_data_files(directory, names, reader.match, _PEEK_BYTES, where,
                             reader.archives)
    labels = [label for label, _ in peeked]
    check_data_files(dataset.reader, labels, names, where)
    layout, release = layout_of(dataset.reader, labels), release_of(labels)
    # another GroupLens release than asked for (a folder named like the one asked for is no
    # reason to suggest it again)
    other = release if release not in (None, dataset.name) else None
    if dataset.layout and layout != dataset.layout:
        use = f"{other} (or movielens, for" if other else "movielens (for"
        raise VaecfError(f"{where}: holds {labels[0]}, but {dataset.name} expects "
                         f"{dataset.layout} ({dataset.name}.zip holds "
                         f"{dataset.folder}/{dataset.layout}): use --dataset {use} any "
                         "MovieLens ratings file)")
    if dataset.folder and other:
        raise VaecfError(f"{where}: holds {labels[0]}, GroupLens' {other}, not "
                         f"{dataset.name}: use --dataset {other}")
    if reader.probe is not None:
        for label, first in peeked:
            reader.probe(label, first)  # e.g. a ratings.csv without a userId column
    if columns is not None:
        probe_table(directory, peeked, columns, where)
    return {"data_files": labels, "layout": layout, "release": release}


def _expand_source(source: str, reader: Reader) -> list[tuple[str, str]]:
    """``(uri, relative name)`` pairs of the data files (and archives, if ``reader`` opens
    them) a source holds."""
    def taken(name: str) -> bool:
        return (reader.archives and is_archive(name)) or reader.match(name)

    wanted = "data files or archives" if reader.archives else reader.expected
    if storage.is_s3(source) and source.endswith("/"):
        keys = [k for k in storage.list_keys(source) if taken(k)]
        if not keys:
            raise VaecfError(f"{source}: no {wanted} under this prefix")
        return [(source + key, key) for key in keys]
    local = Path(source.removeprefix("file://"))
    if "://" not in source.removeprefix("file://") and local.is_dir():
        files = [path.relative_to(local).as_posix() for path in _files_below(local)]
        names = [name for name in files if taken(name)]
        if not names:
            raise VaecfError(f"{source}: source directory holds no {wanted} "
                             f"among its {len(files)} files (subfolders included)")
        # a file of the folder that is a symbolic link to a file elsewhere (another tenant's)
        # stops the stage, as a name climbing out with '..' does
        return [(str(inside(local, name, source)), name) for name in names]
    return [(source, source_name(source))]


def check_local_source(dataset: Dataset, source: str | None, output: str,
                       columns: TableColumns | None = None) -> None:
    """A local source's data files checked where they lie, before any byte is copied: what
    ``inspect_download`` checks of the copies (names, header lines, a Parquet footer) and
    that they fit on the output's file system. A 20 GiB file with no header is refused
    without being copied and hashed first.

    Archives are left to the check of the copies (looking into a tar reads all of it), and
    so are a single file given through a symbolic link and any remote source.
    """
    if source is None or "://" in source.removeprefix("file://") or storage.is_s3(source):
        return
    local = Path(source.removeprefix("file://"))
    if not local.exists() or (not local.is_dir() and local.is_symlink()):
        return
    reader = READERS[dataset.reader]
    targets = _expand_source(source, reader)
    names = [name for _, name in targets]
    if any(is_archive(name) for name in names):
        return
    folder = local if local.is_dir() else local.parent
    inspect_download(dataset, folder, names, source, columns)
    size = sum((folder / name).stat().st_size for name in names)
    # a local output is staged beside it; an S3 one in the temporary folder, then uploaded
    target = Path(os.path.abspath(tempfile.gettempdir() if storage.is_s3(output)
                                  else local_path(output)))
    existing = next(p for p in (target, *target.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if size > free:
        raise VaecfError(f"{source}: {size:,} bytes to copy, {free:,} free on "
                         f"{existing}; nothing was written")


def _files_below(directory: Path) -> list[Path]:
    """Files in ``directory`` and its subfolders, sorted; hidden folders are skipped."""
    found: list[Path] = []
    for root, folders, files in os.walk(directory):
        folders[:] = [name for name in folders if not name.startswith(".")]
        found.extend(Path(root) / name for name in files)
    return sorted(found)


def _fetch_verified(uri: str, dest: Path, name: str, remote: RemoteFile | None,
                    policy: RetryPolicy) -> dict[str, Any]:
    dest.parent.mkdir(parents=True, exist_ok=True)
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
    return {"name": name, "source": uri, "bytes": size, "md5": md5,
            "expected_md5": expected_md5}


def _generate(directory: Path, size: SyntheticSize) -> dict[str, Any]:
    from vaecf.data.synthetic import iter_ratings, write_ratings_csv

    if size.n_users < 1 or size.n_items < 2:
        raise VaecfError(f"--synthetic-users/--synthetic-items: need at least 1 user and 2 "
                         f"items, got {size.n_users} and {size.n_items}")
    path = directory / "ratings.csv"
    written = write_ratings_csv(iter_ratings(size.n_users, size.n_items, size.seed), path)
    log.info(f"synthetic: {written:,} ratings of {size.n_users:,} users x "
             f"{size.n_items:,} items (seed {size.seed})")
    return {"name": path.name, "source": "generated", "bytes": path.stat().st_size,
            "md5": md5_file(path), "expected_md5": None}
