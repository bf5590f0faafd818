"""vaecf.io against a real S3 server on loopback and the local filesystem."""

from __future__ import annotations

import json
import os
from pathlib import Path

import boto3
import pytest

from vaecf.errors import VaecfError
from vaecf.io import open_input, open_input_file, publish, read_manifest, storage, write_manifest

TOY = "toy_manifest.json"


def _write_stage(staging: Path, payload: bytes) -> None:
    (staging / "data.bin").write_bytes(payload)
    (staging / "sub").mkdir()
    (staging / "sub" / "x.txt").write_text("x")
    write_manifest(staging, "toy", inputs={}, parameters={"a": 1}, counts={}, started=0.0)


def test_s3_round_trip_with_multipart(s3_bucket: str, tmp_path: Path) -> None:
    payload = os.urandom(9 * 1024 * 1024 + 17)  # above the 8 MiB multipart threshold
    uri = f"s3://{s3_bucket}/runs/one"
    with publish(uri, TOY) as staging:
        _write_stage(staging, payload)
    keys = storage.list_keys(uri)
    assert keys == ["_SUCCESS", "data.bin", "sub/x.txt", "toy_manifest.json"]
    with open_input(uri) as local:
        assert (local / "data.bin").read_bytes() == payload
        manifest = read_manifest(local, "toy")
        assert manifest["parameters"] == {"a": 1}
        assert set(manifest["files"]) == {"data.bin", "sub/x.txt"}


def test_s3_prefix_without_success_is_refused(s3_bucket: str) -> None:
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="half/data.bin", Body=b"123")
    with pytest.raises(VaecfError, match="no _SUCCESS marker"), \
            open_input(f"s3://{s3_bucket}/half"):
        pass


def test_s3_missing_key(s3_bucket: str, tmp_path: Path) -> None:
    with pytest.raises(VaecfError, match=r"s3://.*/nope\.zip: S3 error"):
        storage.download_file(f"s3://{s3_bucket}/nope.zip", tmp_path / "x")


def test_s3_republish_removes_the_previous_outputs_objects(s3_bucket: str) -> None:
    uri = f"s3://{s3_bucket}/out"
    with publish(uri, TOY) as staging:
        (staging / "old.txt").write_text("old")
        write_manifest(staging, "toy", inputs={}, parameters={}, counts={}, started=0.0)
    with publish(uri, TOY) as staging:
        (staging / "new.txt").write_text("new")
        write_manifest(staging, "toy", inputs={}, parameters={}, counts={}, started=0.0)
    assert storage.list_keys(uri) == ["_SUCCESS", "new.txt", TOY]


def test_s3_missing_bucket_fails_before_work(s3_bucket: str) -> None:
    ran = False
    with pytest.raises(VaecfError, match="no-such-bucket"), publish("s3://no-such-bucket/x", TOY):
        ran = True
    assert not ran


def test_local_publish_is_atomic(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with pytest.raises(RuntimeError), publish(str(target), TOY) as staging:
        (staging / "partial").write_text("half")
        raise RuntimeError("killed")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []
    with publish(str(target), TOY) as staging:
        _write_stage(staging, b"abc")
    with publish(str(target), TOY) as staging:  # replacing an older output
        _write_stage(staging, b"def")
    assert (target / "data.bin").read_bytes() == b"def"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_unwritable_output(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(VaecfError, match="not writable"), publish(str(blocker / "out"), TOY):
        pass


def test_manifest_detects_tampering(tmp_path: Path) -> None:
    with publish(str(tmp_path / "out"), TOY) as staging:
        _write_stage(staging, b"abc")
    out = tmp_path / "out"
    (out / "data.bin").write_bytes(b"abd")
    with pytest.raises(VaecfError, match=r"data\.bin: SHA-256 does not match"):
        read_manifest(out, "toy")
    (out / "toy_manifest.json").unlink()
    with pytest.raises(VaecfError, match="manifest missing"):
        read_manifest(out, "toy")


def test_manifest_is_deterministic_but_for_run(tmp_path: Path) -> None:
    docs = []
    for name in ("a", "b"):
        with publish(str(tmp_path / name), TOY) as staging:
            _write_stage(staging, b"same")
        doc = json.loads((tmp_path / name / "toy_manifest.json").read_text())
        doc.pop("run")
        docs.append(doc)
    assert docs[0] == docs[1]


def test_open_input_file_local_and_s3(s3_bucket: str, tmp_path: Path) -> None:
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="a/metrics.json", Body=b"{}")
    with open_input_file(f"s3://{s3_bucket}/a/metrics.json") as path:
        assert path.name == "metrics.json" and path.read_bytes() == b"{}"
    assert not path.exists()  # the download is temporary
    with pytest.raises(VaecfError, match=r"nope\.json: input file does not exist"), \
            open_input_file(str(tmp_path / "nope.json")):
        pass
