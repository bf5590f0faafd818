"""``vaecf.data.fetch`` and ``download``: a real HTTP server on loopback, real files."""

from __future__ import annotations

import hashlib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from loopback_http import FixtureServer, serve, url

from vaecf.data.datasets import DATASETS, GROUPLENS, Dataset, RemoteFile, get_dataset
from vaecf.data.download import download_dataset, inspect_download
from vaecf.data.fetch import RetryPolicy, fetch
from vaecf.errors import VaecfError

PAYLOAD = bytes(range(256)) * 4000  # 1,024,000 bytes
FAST = RetryPolicy(attempts=4, backoff_seconds=0.01, timeout_seconds=5)


@pytest.fixture()
def http_server() -> Iterator[FixtureServer]:
    yield from serve()


def test_plain_download(http_server: FixtureServer, tmp_path: Path) -> None:
    http_server.files["a.bin"] = PAYLOAD
    fetch(url(http_server, "plain/a.bin"), tmp_path / "a.bin", FAST)
    assert (tmp_path / "a.bin").read_bytes() == PAYLOAD
    assert http_server.requests == [("/plain/a.bin", None)]


def test_dropped_connection_resumes_with_range(http_server: FixtureServer,
                                               tmp_path: Path) -> None:
    http_server.files["a.bin"] = PAYLOAD
    fetch(url(http_server, "drop/a.bin"), tmp_path / "a.bin", FAST)
    assert (tmp_path / "a.bin").read_bytes() == PAYLOAD
    third = len(PAYLOAD) // 3
    assert http_server.requests == [("/drop/a.bin", None), ("/drop/a.bin", f"bytes={third}-")]


def test_server_without_range_support_restarts_from_zero(http_server: FixtureServer,
                                                         tmp_path: Path) -> None:
    http_server.files["a.bin"] = PAYLOAD
    fetch(url(http_server, "norange/a.bin"), tmp_path / "a.bin", FAST)
    assert (tmp_path / "a.bin").read_bytes() == PAYLOAD
    assert len(http_server.requests) == 2


def test_transient_error_is_retried(http_server: FixtureServer, tmp_path: Path) -> None:
    http_server.files["a.bin"] = PAYLOAD
    fetch(url(http_server, "flaky/a.bin"), tmp_path / "a.bin", FAST)
    assert (tmp_path / "a.bin").read_bytes() == PAYLOAD
    assert len(http_server.requests) == 2


def test_missing_file_fails_at_once(http_server: FixtureServer, tmp_path: Path) -> None:
    with pytest.raises(VaecfError, match=r"/plain/nothing.zip: HTTP 404"):
        fetch(url(http_server, "plain/nothing.zip"), tmp_path / "x", FAST)
    assert len(http_server.requests) == 1


def test_unreachable_server_gives_up_after_the_attempts(tmp_path: Path) -> None:
    server = FixtureServer()
    port = server.server_address[1]
    server.server_close()  # nothing listens on this port any more
    with pytest.raises(VaecfError, match="download failed after 4 attempts"):
        fetch(f"http://127.0.0.1:{port}/a.bin", tmp_path / "a.bin", FAST)


def test_unresolvable_host_fails_at_once(tmp_path: Path) -> None:
    # RFC 2606: ".invalid" never resolves. Before, this was retried like a dropped
    # connection (6 attempts, ~31 s without network).
    slow = RetryPolicy(attempts=4, backoff_seconds=30, timeout_seconds=5)
    with pytest.raises(VaecfError) as err:
        fetch("http://vaecf-test.invalid/a.zip", tmp_path / "a.zip", slow)
    assert str(err.value).startswith("http://vaecf-test.invalid/a.zip: cannot resolve host "
                                     "'vaecf-test.invalid' (")
    assert "attempts" not in str(err.value)


def test_published_checksum_is_verified(http_server: FixtureServer, tmp_path: Path) -> None:
    http_server.files["data.zip"] = PAYLOAD
    good = RemoteFile("data.zip", url(http_server, "plain/data.zip"),
                      md5=hashlib.md5(PAYLOAD).hexdigest(), size=len(PAYLOAD))
    records = download_dataset(Dataset("x", (good,), "movielens"), None, tmp_path, FAST)
    assert records == [{"name": "data.zip", "source": good.url, "bytes": len(PAYLOAD),
                        "md5": good.md5, "expected_md5": good.md5}]
    bad = RemoteFile("data.zip", good.url, md5="0" * 32)
    with pytest.raises(VaecfError, match=r"checksum mismatch for data\.zip"):
        download_dataset(Dataset("x", (bad,), "movielens"), None, tmp_path, FAST)


def test_source_with_the_registry_name_is_checked(http_server: FixtureServer,
                                                  tmp_path: Path) -> None:
    http_server.files["ml-20m.zip"] = PAYLOAD
    with pytest.raises(VaecfError, match="expected MD5 cd245b17a1ae2cc31bb14903e1204af3"):
        download_dataset(get_dataset("ml-20m"), url(http_server, "plain/ml-20m.zip"),
                         tmp_path, FAST)


def test_local_directory_and_file_sources(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "part2" / ".hidden").mkdir(parents=True)
    (source / "combined_data_1.txt").write_bytes(b"1:\n")
    (source / "part2" / "combined_data_2.txt").write_bytes(b"2:\n")
    (source / "part2" / "notes.txt").write_bytes(b"not a data file")
    (source / "part2" / ".hidden" / "combined_data_3.txt").write_bytes(b"3:\n")
    (source / "nf.tar.gz").write_bytes(b"an archive may hold data files")
    out = tmp_path / "out"
    out.mkdir()
    records = download_dataset(get_dataset("netflix"), str(source), out, FAST)
    assert [r["name"] for r in records] == ["combined_data_1.txt", "nf.tar.gz",
                                            "part2/combined_data_2.txt"]
    assert (out / "part2" / "combined_data_2.txt").read_bytes() == b"2:\n"
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_bytes(b"not a data file")
    with pytest.raises(VaecfError, match=r"docs: source directory holds no data files or "
                                         r"archives among its 1 files \(subfolders included"):
        download_dataset(get_dataset("netflix"), str(tmp_path / "docs"), out, FAST)
    fetch(f"file://{source}/part2/combined_data_2.txt", out / "copy.txt", FAST)
    assert (out / "copy.txt").read_bytes() == b"2:\n"
    with pytest.raises(VaecfError, match="source file does not exist"):
        fetch(str(source / "missing.txt"), out / "m", FAST)


def test_s3_object_and_prefix_sources(s3_bucket: str, tmp_path: Path) -> None:
    s3 = boto3.client("s3")
    s3.put_object(Bucket=s3_bucket, Key="nf/combined_data_1.txt", Body=b"1:\n5,3,2005-01-01\n")
    s3.put_object(Bucket=s3_bucket, Key="nf/more/combined_data_2.txt", Body=b"2:\n")
    s3.put_object(Bucket=s3_bucket, Key="nf/_SUCCESS", Body=b"")
    fetch(f"s3://{s3_bucket}/nf/combined_data_1.txt", tmp_path / "one.txt", FAST)
    assert (tmp_path / "one.txt").read_bytes() == b"1:\n5,3,2005-01-01\n"
    records = download_dataset(get_dataset("netflix"), f"s3://{s3_bucket}/nf/", tmp_path, FAST)
    assert [r["name"] for r in records] == ["combined_data_1.txt", "more/combined_data_2.txt"]
    assert (tmp_path / "more" / "combined_data_2.txt").read_bytes() == b"2:\n"


def test_registry() -> None:
    releases = ["ml-100k", "ml-1m", "ml-10m", "ml-20m", "ml-25m", "ml-32m", "ml-latest",
                "ml-latest-small"]
    assert list(DATASETS) == [*releases, "movielens", "netflix", "lastfm", "pinterest",
                              "synthetic", "table"]
    for name in releases:
        (remote,) = DATASETS[name].files
        assert remote.url == f"https://files.grouplens.org/datasets/movielens/{name}.zip"
        assert remote.url == f"{GROUPLENS}/{remote.name}"
        # GroupLens re-releases ml-latest* in place: a pinned MD5 would break every download.
        assert (remote.md5 is None) == name.startswith("ml-latest"), name
    assert DATASETS["ml-10m"].folder == "ml-10M100K"
    assert DATASETS["netflix"].requires_source and DATASETS["movielens"].requires_source
    with pytest.raises(VaecfError, match="unknown dataset 'ml-1b'"):
        get_dataset("ml-1b")
    with pytest.raises(VaecfError, match="--source: required for dataset 'netflix'"):
        download_dataset(get_dataset("netflix"), None, Path("/nonexistent"), FAST)


FIRST_LINES = {"ratings.dat": b"1::2::4::5\n", "u.data": b"1\t2\t4\t5\n",
               "ratings.csv": b"userId,movieId,rating,timestamp\n1,2,4,5\n"}


def _zip(path: Path, *members: str) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for member in members:
            archive.writestr(member, FIRST_LINES.get(Path(member).name, b"x\n"))
    return path


@pytest.mark.parametrize(("dataset", "members", "layout", "release"), [
    ("ml-1m", ["ml-1m/ratings.dat", "ml-1m/movies.dat"], "ratings.dat", "ml-1m"),
    ("ml-10m", ["ml-10M100K/ratings.dat", "ml-10M100K/tags.dat"], "ratings.dat", "ml-10m"),
    ("ml-100k", ["ml-100k/u.data", "ml-100k/u1.base", "ml-100k/u.item"], "u.data", "ml-100k"),
    ("ml-25m", ["ml-25m/ratings.csv", "ml-25m/movies.csv"], "ratings.csv", "ml-25m"),
    ("ml-1m", ["ratings.dat"], "ratings.dat", None),
    ("movielens", ["ml-1m/ratings.dat"], "ratings.dat", "ml-1m"),
    ("movielens", ["mine/u.data"], "u.data", None),
])
def test_inspect_download_names_layout_and_release(tmp_path: Path, dataset: str,
                                                   members: list[str], layout: str,
                                                   release: str | None) -> None:
    _zip(tmp_path / "a.zip", *members)
    contents = inspect_download(get_dataset(dataset), tmp_path, ["a.zip"], "SRC")
    assert contents == {"data_files": [f"a.zip:{members[0]}"], "layout": layout,
                        "release": release}


@pytest.mark.parametrize(("dataset", "members", "expected"), [
    ("ml-20m", ["ml-1m/ratings.dat"], "SRC: holds a.zip:ml-1m/ratings.dat, but ml-20m expects "
     "ratings.csv (ml-20m.zip holds ml-20m/ratings.csv): use --dataset ml-1m (or movielens, "
     "for any MovieLens ratings file)"),
    ("ml-1m", ["x/u.data"], "SRC: holds a.zip:x/u.data, but ml-1m expects ratings.dat "
     "(ml-1m.zip holds ml-1m/ratings.dat): use --dataset movielens (for any MovieLens "
     "ratings file)"),
    # A ratings.csv in a folder named ml-100k: never "use --dataset ml-100k" to its user.
    ("ml-100k", ["ml-100k/ratings.csv"], "SRC: holds a.zip:ml-100k/ratings.csv, but ml-100k "
     "expects u.data (ml-100k.zip holds ml-100k/u.data): use --dataset movielens (for any "
     "MovieLens ratings file)"),
    ("ml-20m", ["ml-latest-small/ratings.csv"], "SRC: holds a.zip:ml-latest-small/ratings.csv, "
     "GroupLens' ml-latest-small, not ml-20m: use --dataset ml-latest-small"),
    ("ml-20m", ["ml-20m/movies.csv"], "SRC: no ratings.csv, ratings.dat or u.data among a.zip"),
    ("movielens", ["a/ratings.csv", "b/u.data"], "SRC: several MovieLens ratings files "
     "(a.zip:a/ratings.csv, a.zip:b/u.data); expected one"),
])
def test_inspect_download_refuses_what_the_dataset_is_not(tmp_path: Path, dataset: str,
                                                          members: list[str],
                                                          expected: str) -> None:
    _zip(tmp_path / "a.zip", *members)
    with pytest.raises(VaecfError) as err:
        inspect_download(get_dataset(dataset), tmp_path, ["a.zip"], "SRC")
    assert str(err.value).startswith(expected)


def test_inspect_download_names_a_truncated_archive(tmp_path: Path) -> None:
    data = _zip(tmp_path / "a.zip", "ml-1m/ratings.dat").read_bytes()
    (tmp_path / "a.zip").write_bytes(data[: len(data) // 2])
    with pytest.raises(VaecfError, match=r"^SRC: archive a\.zip is corrupt or truncated"):
        inspect_download(get_dataset("ml-1m"), tmp_path, ["a.zip"], "SRC")


@pytest.mark.parametrize(("member", "content", "expected"), [
    ("ml-20m/ratings.csv", b"", "a.zip:ml-20m/ratings.csv: file is empty"),
    ("ml-20m/ratings.csv", b"user,movie,rating\n1,2,3\n",
     "a.zip:ml-20m/ratings.csv: line 1: missing column 'userId'"),
    ("ml-20m/ratings.csv", b"\xef\xbb\xbfuserId,movieId,rating,rating\n",
     "a.zip:ml-20m/ratings.csv: line 1: column 'rating' appears 2 times"),
    ("ml-1m/ratings.dat", b"userId,movieId,rating,timestamp\n1,2,3,4\n",
     "a.zip:ml-1m/ratings.dat: line 1: expected 4 fields"),
    ("ml-100k/u.data", b"", "a.zip:ml-100k/u.data: file is empty"),
])
def test_inspect_download_reads_the_first_line(tmp_path: Path, member: str, content: bytes,
                                               expected: str) -> None:
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as archive:
        archive.writestr(member, content)
    with pytest.raises(VaecfError) as err:
        inspect_download(get_dataset("movielens"), tmp_path, ["a.zip"], "SRC")
    assert str(err.value).startswith(expected)
