"""``vaecf.data.fetch`` and ``download``: a real HTTP server on loopback, real files."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from loopback_http import FixtureServer, serve, url

from vaecf.data.datasets import DATASETS, Dataset, RemoteFile, get_dataset
from vaecf.data.download import download_dataset
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
    source.mkdir()
    (source / "combined_data_1.txt").write_bytes(b"1:\n")
    (source / "combined_data_2.txt").write_bytes(b"2:\n")
    out = tmp_path / "out"
    out.mkdir()
    records = download_dataset(get_dataset("netflix"), str(source), out, FAST)
    assert [r["name"] for r in records] == ["combined_data_1.txt", "combined_data_2.txt"]
    fetch(f"file://{source}/combined_data_2.txt", out / "copy.txt", FAST)
    assert (out / "copy.txt").read_bytes() == b"2:\n"
    with pytest.raises(VaecfError, match="source file does not exist"):
        fetch(str(source / "missing.txt"), out / "m", FAST)


def test_s3_object_and_prefix_sources(s3_bucket: str, tmp_path: Path) -> None:
    s3 = boto3.client("s3")
    s3.put_object(Bucket=s3_bucket, Key="nf/combined_data_1.txt", Body=b"1:\n5,3,2005-01-01\n")
    s3.put_object(Bucket=s3_bucket, Key="nf/combined_data_2.txt", Body=b"2:\n")
    fetch(f"s3://{s3_bucket}/nf/combined_data_1.txt", tmp_path / "one.txt", FAST)
    assert (tmp_path / "one.txt").read_bytes() == b"1:\n5,3,2005-01-01\n"
    records = download_dataset(get_dataset("netflix"), f"s3://{s3_bucket}/nf/", tmp_path, FAST)
    assert [r["name"] for r in records] == ["combined_data_1.txt", "combined_data_2.txt"]


def test_registry() -> None:
    assert set(DATASETS) == {"ml-20m", "netflix", "lastfm", "pinterest", "synthetic"}
    assert DATASETS["netflix"].requires_source
    with pytest.raises(VaecfError, match="unknown dataset 'ml-1b'"):
        get_dataset("ml-1b")
    with pytest.raises(VaecfError, match="--source: required for dataset 'netflix'"):
        download_dataset(get_dataset("netflix"), None, Path("/nonexistent"), FAST)
