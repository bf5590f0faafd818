"""``vaecf download`` end to end: loopback HTTP, moto S3, local files; errors in one line."""

from __future__ import annotations

import hashlib
import json
import zipfile
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
    for part in ("train", "test"):
        s3.put_object(Bucket=s3_bucket, Key=f"in/pinterest-20.{part}.rating", Body=b"0\t1\t1\n")
    code, _, err = cli("download", "--dataset", "pinterest", "--source", f"s3://{s3_bucket}/in/",
                       "--output", f"s3://{s3_bucket}/raw")
    assert code == 0, err
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix="raw/")["Contents"]}
    assert keys == {"raw/pinterest-20.train.rating", "raw/pinterest-20.test.rating",
                    "raw/download_manifest.json", "raw/_SUCCESS"}


def test_local_file_source(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "combined_data_1.txt").write_bytes(PAYLOAD)
    code, _, err = cli("download", "--dataset", "netflix", "--source",
                       f"file://{tmp_path}/combined_data_1.txt", "--output", tmp_path / "raw")
    assert code == 0, err
    assert read_manifest(tmp_path / "raw", "download")["downloads"][0]["bytes"] == len(PAYLOAD)


@pytest.mark.parametrize(("argv", "expected"), [
    (["--dataset", "ml-1b"], "unknown dataset 'ml-1b' (one of: ml-100k, ml-1m, ml-10m, ml-20m, "
                             "ml-25m, ml-32m, ml-latest, ml-latest-small, movielens, netflix"),
    (["--dataset", "movielens"], "--source: required for dataset 'movielens'"),
    (["--dataset", "netflix"], "--source: required for dataset 'netflix'"),
    (["--dataset", "netflix", "--source", "/nonexistent/combined_data_1.txt"],
     "/nonexistent/combined_data_1.txt: input file does not exist"),
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


def _write_zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_release_other_than_the_archive_fails_at_download(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Before: exit 0 with the contents unchecked; preprocess then said "no ratings.csv".
    source = _write_zip(tmp_path / "ml-1m.zip", {"ml-1m/ratings.dat": b"1::2::4::5\n"})
    result = cli("download", "--dataset", "ml-20m", "--source", source,
                 "--output", tmp_path / "raw")
    assert_failed(result, tmp_path / "raw", f"{source}: holds ml-1m.zip:ml-1m/ratings.dat, but "
                  "ml-20m expects ratings.csv (ml-20m.zip holds ml-20m/ratings.csv): use "
                  "--dataset ml-1m")


def test_layout_and_release_are_recorded(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Not named ml-10m.zip: that name is checked against GroupLens' MD5.
    source = _write_zip(tmp_path / "ml-10m-sample.zip",
                        {"ml-10M100K/ratings.dat": b"1::2::4.5::5\n"})
    code, out, err = cli("download", "--dataset", "ml-10m", "--source", source,
                         "--output", tmp_path / "raw")
    assert code == 0, err
    manifest = read_manifest(tmp_path / "raw", "download")
    assert (manifest["dataset"], manifest["layout"], manifest["release"]) == (
        "ml-10m", "ratings.dat", "ml-10m")
    assert manifest["data_files"] == ["ml-10m-sample.zip:ml-10M100K/ratings.dat"]
    # The folder is named like the release, but no published checksum proved it.
    assert manifest["verified_release"] is None
    assert "ml-10m: ml-10m-sample.zip:ml-10M100K/ratings.dat (ratings.dat)\n" in out


def test_a_release_is_verified_only_by_its_published_checksum(cli, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                              monkeypatch) -> None:
    """ml-1m.zip whose MD5 is the registry's (patched: the real zip is not in the tests)."""
    from vaecf.data import datasets

    source = _write_zip(tmp_path / "ml-1m.zip", {"ml-1m/ratings.dat": b"1::2::4::5\n"})
    published = datasets._grouplens("ml-1m", "ratings.dat",
                                    hashlib.md5(source.read_bytes()).hexdigest())
    monkeypatch.setitem(datasets.DATASETS, "ml-1m", published)
    code, out, err = cli("download", "--dataset", "ml-1m", "--source", source,
                         "--output", tmp_path / "raw")
    assert code == 0, err
    assert read_manifest(tmp_path / "raw", "download")["verified_release"] == "ml-1m"
    assert "(ratings.dat, GroupLens ml-1m: published MD5 matched)" in out


def test_folder_holding_a_dataset_folder(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Before: "source directory holds no files".
    release = tmp_path / "data" / "ml-latest-small"
    release.mkdir(parents=True)
    (release / "ratings.csv").write_bytes(b"userId,movieId,rating,timestamp\n1,2,4.0,5\n")
    (release / "movies.csv").write_bytes(b"movieId,title\n2,Jumanji\n")
    code, _, err = cli("download", "--dataset", "ml-latest-small", "--source",
                       f"{tmp_path / 'data'}/", "--output", tmp_path / "raw")
    assert code == 0, err
    manifest = read_manifest(tmp_path / "raw", "download")
    assert [r["name"] for r in manifest["downloads"]] == ["ml-latest-small/ratings.csv"]
    assert (manifest["layout"], manifest["release"]) == ("ratings.csv", "ml-latest-small")
    assert (tmp_path / "raw" / "ml-latest-small" / "ratings.csv").read_bytes() == (
        release / "ratings.csv").read_bytes()


@pytest.mark.parametrize("present", ["pinterest-20.test.rating", "pinterest-20.train.rating"])
def test_pinterest_with_one_of_its_two_files(cli, tmp_path: Path, present: str) -> None:  # type: ignore[no-untyped-def]
    # Before: exit 0, then preprocess said "every user was filtered out ... lower the
    # thresholds", which points the user the wrong way.
    (tmp_path / "pins").mkdir()
    (tmp_path / "pins" / present).write_bytes(b"0\t1\t1\n")
    missing = present.replace("test", "TRAIN").replace("train", "test").replace("TRAIN", "train")
    result = cli("download", "--dataset", "pinterest", "--source", tmp_path / "pins",
                 "--output", tmp_path / "raw")
    assert_failed(result, tmp_path / "raw", f"{missing} is missing (found {present}); "
                  "pinterest needs both pinterest-20.train.rating and pinterest-20.test.rating")


def test_unresolvable_host_is_not_retried(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Before: retried 6 times (~31 s) as if the network had dropped.
    result = cli("download", "--dataset", "pinterest", "--source",
                 "http://vaecf-test.invalid/pinterest-20.train.rating",
                 "--output", tmp_path / "raw")
    assert_failed(result, tmp_path / "raw", "cannot resolve host 'vaecf-test.invalid'",
                  "no network, or a wrong name")
    assert "retrying" not in result[1]


@pytest.mark.parametrize("prefix,key", [("abs", "abs//{tmp}/evil/pinterest-20.test.rating"),
                                        ("up", "up/../../evil/pinterest-20.test.rating")])
def test_an_s3_source_key_that_leaves_its_prefix_is_refused(  # type: ignore[no-untyped-def]
        cli, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix: str,
        key: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # "../../evil" from out/'s staging area (work/.out.staging-*/out/)
    s3 = boto3.client("s3")
    s3.put_object(Bucket=s3_bucket, Key=f"{prefix}/pinterest-20.train.rating", Body=b"0\t1\t1\n")
    evil = key.format(tmp=tmp_path)
    s3.put_object(Bucket=s3_bucket, Key=evil, Body=b"0\t1\t1\n")
    assert_failed(cli("download", "--dataset", "pinterest", "--source",
                      f"s3://{s3_bucket}/{prefix}/", "--output", "out"),
                  work / "out", evil.removeprefix(f"{prefix}/"), "is not a path inside")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    assert list(work.iterdir()) == []


def test_a_source_that_is_a_link_loop_is_one_line(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert_failed(cli("download", "--dataset", "movielens", "--source", loop,
                      "--output", tmp_path / "raw"), tmp_path / "raw",
                  f"{loop} is a symbolic link to nothing")
