"""The datasets ``vaecf download`` knows: where they live, how to check them, how to read them.

Each entry names the raw files as their publisher distributes them. A published checksum
(GroupLens prints an MD5 beside every MovieLens zip) is verified on download; datasets
without one get their SHA-256 recorded in ``download_manifest.json`` instead, so later
stages can still refuse a changed file.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """A dataset: its default files and the reader ``vaecf preprocess`` uses for it."""

    name: str
    files: tuple[RemoteFile, ...]
    reader: str
    requires_source: bool = False
    note: str = ""


GROUPLENS = "https://files.grouplens.org/datasets/movielens"
NCF_DATA = "https://raw.githubusercontent.com/hexiangnan/neural_collaborative_filtering/master/Data"

DATASETS: dict[str, Dataset] = {
    "ml-20m": Dataset(
        name="ml-20m",
        # MD5 from GroupLens' sidecar ml-20m.zip.md5; size as GroupLens' server reports it.
        files=(RemoteFile("ml-20m.zip", f"{GROUPLENS}/ml-20m.zip",
                          md5="cd245b17a1ae2cc31bb14903e1204af3", size=198_702_078),),
        reader="movielens",
    ),
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
}


def get_dataset(name: str) -> Dataset:
    """The registry entry for ``name``; an unknown name is a user error."""
    try:
        return DATASETS[name]
    except KeyError:
        raise VaecfError(f"unknown dataset '{name}' (one of: {', '.join(DATASETS)})") from None
