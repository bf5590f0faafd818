"""Objects read in place (``storage.open_source``: ranged GETs, what a Spark engine's task
opens instead of a local copy) and an ``s3://`` output's staging prefix (``remote_staging``:
where the tasks write parts, published by a copy inside the store)."""

from __future__ import annotations

import hashlib

import boto3
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vaecf.io import publish, storage
from vaecf.io.manifest import sha256_source
from vaecf.io.publish import remote_scratch, remote_staging
from vaecf.io.readers import read_parquet


def test_an_object_read_in_place_reads_its_bytes(s3_bucket: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "RANGE_BYTES", 1000)  # many ranges for a small object
    data = b"".join(b"%d,%d\n" % (n, n * n) for n in range(20_000))
    uri = f"s3://{s3_bucket}/lines.csv"
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="lines.csv", Body=data)
    assert storage.source_size(uri) == len(data)
    with storage.open_source(uri) as handle:
        assert handle.readline() == b"0,0\n"
        handle.seek(len(data) - 20)
        assert handle.read() == data[-20:]
        handle.seek(54_321)
        assert handle.read(70_000) == data[54_321:54_321 + 70_000]
        assert handle.tell() == 54_321 + 70_000
    assert sha256_source(uri) == (hashlib.sha256(data).hexdigest(), len(data))


def test_a_parquet_object_is_read_by_row_groups_in_place_on_the_calling_thread(  # type: ignore[no-untyped-def]
        s3_bucket: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read on the calling thread only: Arrow's threads reading a Python file take the GIL,
    and one still holding it at interpreter exit aborts the process (exit 134), while a
    local path, read natively, keeps Arrow's threads."""
    threads: list[object] = []

    def spying(real):  # type: ignore[no-untyped-def]
        def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            threads.append(kwargs.get("use_threads"))
            return real(self, *args, **kwargs)
        return spy

    for name in ("read", "read_row_groups"):
        monkeypatch.setattr(pq.ParquetFile, name, spying(getattr(pq.ParquetFile, name)))
    table = pa.table({"user_id": np.arange(10_000), "item_id": np.arange(10_000) % 7})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=3_000)
    storage.upload_file(tmp_path / "t.parquet", f"s3://{s3_bucket}/t.parquet")
    read = read_parquet(f"s3://{s3_bucket}/t.parquet", {"item_id": "ids"}, row_groups=[2])
    assert read.column("item_id").to_pylist() == table.column("item_id")[6_000:9_000].to_pylist()
    whole = read_parquet(f"s3://{s3_bucket}/t.parquet", {"item_id": "ids"})
    assert whole.column("item_id").equals(table.column("item_id"))
    assert read_parquet(tmp_path / "t.parquet", {"item_id": "ids"}).equals(whole)
    assert threads == [False, False, True]


def test_parts_in_the_staging_prefix_are_published_and_the_prefix_removed(  # type: ignore[no-untyped-def]
        s3_bucket: str) -> None:
    s3 = boto3.client("s3")
    killed = "runs/.out.staging-abcd1234/out/part-0.parquet"  # a killed run's leftovers
    others = ["runs/.outer.staging-abcd1234/out/x", "runs/.out.staging-abcd12345/x"]
    for key in [killed, *others]:
        s3.put_object(Bucket=s3_bucket, Key=key, Body=b"x")
    output = f"s3://{s3_bucket}/runs/out"
    with publish(output, "preprocess_manifest.json") as staging:
        remote, scratch = remote_staging(staging), remote_scratch(staging)
        assert remote is not None and scratch is not None
        assert remote.startswith(f"s3://{s3_bucket}/runs/.out.staging-")
        s3.put_object(Bucket=s3_bucket, Key=f"{storage.split_s3(remote)[1]}/parts/p-0",
                      Body=b"part")
        s3.put_object(Bucket=s3_bucket, Key=f"{storage.split_s3(scratch)[1]}/member",
                      Body=b"never published")
        (staging / "preprocess_manifest.json").write_text("{}")
    assert storage.list_keys(output) == ["_SUCCESS", "parts/p-0", "preprocess_manifest.json"]
    assert storage.read_object(f"{output}/parts/p-0", 10) == b"part"
    left = [k for k in storage.list_keys(f"s3://{s3_bucket}/runs") if not k.startswith("out")]
    assert sorted(left) == sorted(k.removeprefix("runs/") for k in others)


def test_a_local_output_has_no_staging_prefix(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with publish(str(tmp_path / "out"), "x_manifest.json") as staging:
        assert remote_staging(staging) is None and remote_scratch(staging) is None
        (staging / "x_manifest.json").write_text("{}")
