"""``vaecf download`` end to end: loopback HTTP, moto S3, local files; errors in one line."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import boto3
import pytest
import stage_checks
from loopback_http import FixtureServer, serve, url

from vaecf.io import read_manifest

PAYLOAD = b"1:\n5,3,2005-09-06\n" * 40_000


@pytest.fixture()
def http_server() -> Iterator[FixtureServer]:
    yield from serve()


def _manifest_without_run(directory: Path) -> dict[str, object]:
    manifest = json.loads((directory / "download_manifest.json").read_text())
    manifest.pop("run")
    return manifest


assert_failed = partial(stage_checks.assert_failed, "download")


def test_synthetic_is_deterministic(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    for name in ("a", "b"):
        code, _, err = cli("download", "--dataset", "synthetic", "--output", tmp_path / name,
                           "--synthetic-users", 60, "--synthetic-items", 40, "--seed", 7)
        assert code == 0, err
    first, second = tmp_path / "a", tmp_path / "b"
    assert (first / "ratings.csv").read_bytes() == (second / "ratings.csv").read_bytes()
    assert _manifest_without_run(first) == _manifest_without_run(second)
    manifest = read_manifest(first, "download")
    assert manifest["dataset"] == "synthetic"
    assert manifest["parameters"] == {"dataset": "synthetic", "source": None, "n_users": 60,
                                      "n_items": 40, "seed": 7}
    assert manifest["downloads"][0]["md5"] == hashlib.md5(
        (first / "ratings.csv").read_bytes()).hexdigest()


def test_dropped_connection_is_resumed(cli, http_server: FixtureServer,  # type: ignore[no-untyped-def]
                                       tmp_path: Path) -> None:
    http_server.files["combined_data_1.txt"] = PAYLOAD
    code, _, err = cli("download", "--dataset", "netflix", "--source",
                       url(http_server, "drop/combined_data_1.txt"), "--output", tmp_path / "raw")
    assert code == 0, err
    assert (tmp_path / "raw" / "combined_data_1.txt").read_bytes() == PAYLOAD
    assert [r for _, r in http_server.requests] == [None, f"bytes={len(PAYLOAD) // 3}-"]
    manifest = read_manifest(tmp_path / "raw", "download")
    assert manifest["downloads"][0]["md5"] == hashlib.md5(PAYLOAD).hexdigest()


def test_checksum_mismatch(cli, http_server: FixtureServer,  # type: ignore[no-untyped-def]
                           tmp_path: Path) -> None:
    http_server.files["ml-20m.zip"] = PAYLOAD  # not the GroupLens archive
    result = cli("download", "--dataset", "ml-20m", "--source",
                 url(http_server, "plain/ml-20m.zip"), "--output", tmp_path / "raw")
    assert_failed(result, tmp_path / "raw", "checksum mismatch for ml-20m.zip",
                  "expected MD5 cd245b17a1ae2cc31bb14903e1204af3")


def test_http_404(cli, http_server: FixtureServer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("download", "--dataset", "lastfm", "--source",
                 url(http_server, "plain/lastfm-dataset-360K.tar.gz"), "--output", tmp_path / "o")
    assert_failed(result, tmp_path / "o", "lastfm-dataset-360K.tar.gz: HTTP 404")


def test_s3_source_and_s3_output(cli, s3_bucket: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s3 = boto3.client("s3")
    s3.put_object(Bucket=s3_bucket, Key="in/pinterest-20.train.rating", Body=b"0\t1\t1\n")
    code, _, err = cli("download", "--dataset", "pinterest", "--source",
                       f"s3://{s3_bucket}/in/pinterest-20.train.rating",
                       "--output", f"s3://{s3_bucket}/raw")
    assert code == 0, err
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix="raw/")["Contents"]}
    assert keys == {"raw/pinterest-20.train.rating", "raw/download_manifest.json",
                    "raw/_SUCCESS"}


def test_local_file_source(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "combined_data_1.txt").write_bytes(PAYLOAD)
    code, _, err = cli("download", "--dataset", "netflix", "--source",
                       f"file://{tmp_path}/combined_data_1.txt", "--output", tmp_path / "raw")
    assert code == 0, err
    assert read_manifest(tmp_path / "raw", "download")["downloads"][0]["bytes"] == len(PAYLOAD)


@pytest.mark.parametrize(("argv", "expected"), [
    (["--dataset", "ml-1b"], "unknown dataset 'ml-1b' (one of: ml-20m, netflix"),
    (["--dataset", "netflix"], "--source: required for dataset 'netflix'"),
    (["--dataset", "netflix", "--source", "/nonexistent/combined_data_1.txt"],
     "/nonexistent/combined_data_1.txt: source file does not exist"),
    (["--dataset", "netflix", "--source", "ftp://host/x.txt"], "unsupported source scheme"),
    (["--dataset", "synthetic", "--synthetic-users", "0"], "--synthetic-users"),
])
def test_bad_arguments(cli, tmp_path: Path, argv: list[str],  # type: ignore[no-untyped-def]
                       expected: str) -> None:
    assert_failed(cli("download", *argv, "--output", tmp_path / "raw"), tmp_path / "raw",
                  expected)


def test_unwritable_output(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "file").write_text("not a directory")
    output = tmp_path / "file" / "raw"
    result = cli("download", "--dataset", "synthetic", "--output", output)
    assert_failed(result, output, f"{output}: output is not writable")
