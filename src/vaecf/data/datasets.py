"""The datasets ``vaecf download`` knows: where they live, how to check them, how to read them.

Each entry names the raw files as their publisher distributes them. A published checksum
(GroupLens puts an MD5 file beside its MovieLens zips) is verified on download; datasets
without one get their SHA-256 recorded in ``download_manifest.json`` instead, so later
stages can still refuse a changed file. Every GroupLens release has its own name, with the
layout its zip holds; ``movielens`` reads a ratings file of any release, or of none.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from vaecf.data.readers.archive import member_path
from vaecf.errors import VaecfError


@dataclass(frozen=True)
class RemoteFile:
    """One file of a dataset as its publisher serves it.

    Attributes:
      name: file name written into the download directory.
      url: default source (https/http); ``--source`` overrides it.
      md5: the publisher's MD5, if it publishes one.
      size: the publisher's size in bytes, if known.
    """

    name: str
    url: str
    md5: str | None = None
    size: int | None = None


@dataclass(frozen=True)
class Dataset:
    """A dataset: its default files and the reader ``vaecf preprocess`` uses for it.

    Attributes:
      layout: for a MovieLens release, the ratings file its zip holds (``ratings.dat``).
      folder: for a MovieLens release, the folder inside its zip (``ml-10M100K``).
    """

    name: str
    files: tuple[RemoteFile, ...]
    reader: str
    requires_source: bool = False
    note: str = ""
    layout: str = ""
    folder: str = ""


GROUPLENS = "https://files.grouplens.org/datasets/movielens"
NCF_DATA = "https://raw.githubusercontent.com/hexiangnan/neural_collaborative_filtering/master/Data"


def _grouplens(name: str, layout: str, md5: str | None, size: int | None = None,
               folder: str = "") -> Dataset:
    return Dataset(name=name, files=(RemoteFile(f"{name}.zip", f"{GROUPLENS}/{name}.zip",
                                                md5=md5, size=size),),
                   reader="movielens", layout=layout, folder=folder or name)


# MD5s: GroupLens' sidecar files (<name>.zip.md5), as quoted by several independent public
# projects (no network here to fetch them); ml-20m's size as GroupLens' server reports it.
# ml-latest and ml-latest-small are re-released under the same URL, so their MD5 changes and
# none is pinned: the SHA-256 of what was downloaded is recorded instead.
DATASETS: dict[str, Dataset] = {
    "ml-100k": _grouplens("ml-100k", "u.data", "0e33842e24a9c977be4e0107933c0723"),
    "ml-1m": _grouplens("ml-1m", "ratings.dat", "c4d9eecfca2ab87c1945afe126590906"),
    "ml-10m": _grouplens("ml-10m", "ratings.dat", "ce571fd55effeba0271552578f2648bd",
                         folder="ml-10M100K"),
    "ml-20m": _grouplens("ml-20m", "ratings.csv", "cd245b17a1ae2cc31bb14903e1204af3",
                         size=198_702_078),
    "ml-25m": _grouplens("ml-25m", "ratings.csv", "6b51fb2759a8657d3bfcbfc42b592ada"),
    "ml-32m": _grouplens("ml-32m", "ratings.csv", "d472be332d4daa821edc399621853b57"),
    "ml-latest": _grouplens("ml-latest", "ratings.csv", None),
    "ml-latest-small": _grouplens("ml-latest-small", "ratings.csv", None),
    "movielens": Dataset(
        name="movielens", files=(), reader="movielens", requires_source=True,
        note="any MovieLens ratings.csv, ratings.dat or u.data, plain or in a zip"),
    "netflix": Dataset(
        name="netflix", files=(), reader="netflix", requires_source=True,
        note="the Netflix Prize data has no public URL; pass --source (archive, file or dir)",
    ),
    "lastfm": Dataset(
        name="lastfm",
        files=(RemoteFile("lastfm-dataset-360K.tar.gz",
                          "http://mtg.upf.edu/static/datasets/last.fm/"
                          "lastfm-dataset-360K.tar.gz"),),
        reader="lastfm",
    ),
    "pinterest": Dataset(
        name="pinterest",
        # pinterest-20 as processed by He et al. (NCF, WWW 2017): train + leave-one-out test.
        files=(RemoteFile("pinterest-20.train.rating", f"{NCF_DATA}/pinterest-20.train.rating"),
               RemoteFile("pinterest-20.test.rating", f"{NCF_DATA}/pinterest-20.test.rating")),
        reader="pinterest",
    ),
    "synthetic": Dataset(name="synthetic", files=(), reader="movielens"),
    "table": Dataset(
        name="table", files=(), reader="table", requires_source=True,
        note="your own interactions: a Parquet or CSV file, or a folder or s3:// prefix of "
             "them, with --user-column and --item-column"),
}


def release_of(labels: list[str]) -> str | None:
    """The GroupLens release whose zip folder holds the one data file, or None.

    Args:
      labels: data files as the readers name them (``ml-1m.zip:ml-1m/ratings.dat``, or
        ``ml-latest-small/ratings.csv`` for a file copied from a folder source).
    """
    folders = {d.folder: d.name for d in DATASETS.values() if d.folder}
    parents = {PurePosixPath(member_path(label)).parent.name for label in labels}
    return folders.get(parents.pop()) if len(parents) == 1 else None


def get_dataset(name: str) -> Dataset:
    """The registry entry for ``name``; an unknown name is a user error."""
    try:
        return DATASETS[name]
    except KeyError:
        raise VaecfError(f"unknown dataset '{name}' (one of: {', '.join(DATASETS)})") from None
