"""``--engine spark`` with ``s3://`` input and output: the tasks read the input where it lies
and write the output's Parquet parts to the output's S3 staging prefix; the driver publishes
the manifest (every part with its checksum) and ``_SUCCESS`` last. The output equals the
pandas engine's by content, and a failed run leaves nothing published.

One local SparkSession (the ``spark`` fixture), S3 on moto's server (``s3_bucket``)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_spark_engine import _pairs, assert_same_split
from test_split_stage import interactions

from vaecf.data.preprocess import INTERACTIONS, PARTS, interactions_files
from vaecf.data.splits import PART_FILES, load_split, row_group_rows, user_share
from vaecf.io import read_manifest
from vaecf.io.manifest import read_remote_manifest
from vaecf.io.storage import SUCCESS_MARKER, download_dir, list_keys, upload_dir

pytestmark = [pytest.mark.usefixtures("spark"), pytest.mark.slow]


def _synthetic(cli, bucket: str) -> str:  # type: ignore[no-untyped-def]
    """A small synthetic download published at ``s3://<bucket>/raw`` (a plain ratings.csv)."""
    raw = f"s3://{bucket}/raw"
    code, _, err = cli("download", "--dataset", "synthetic", "--synthetic-users", 240,
                       "--synthetic-items", 90, "--output", raw)
    assert code == 0, err
    return raw


def _parts_table(uri: str) -> pa.Table:
    """The rows of an ``s3://`` preprocess output's interactions, its parts in order."""
    manifest = read_remote_manifest(uri, "preprocess")
    s3 = boto3.client("s3")
    bucket, key = uri[len("s3://"):].split("/", 1)
    tables = [pq.read_table(io.BytesIO(s3.get_object(Bucket=bucket, Key=f"{key}/{name}")
                                       ["Body"].read()))
              for name in interactions_files(manifest, uri)]
    return pa.concat_tables(tables)


def test_spark_reads_and_writes_object_storage_as_pandas_does(cli, s3_bucket: str,  # type: ignore[no-untyped-def]
                                                              tmp_path: Path) -> None:
    raw = _synthetic(cli, s3_bucket)
    out = f"s3://{s3_bucket}/interactions"
    code, _, err = cli("preprocess", "--input", raw, "--output", out, "--engine", "spark")
    assert code == 0, err
    code, _, err = cli("preprocess", "--input", raw, "--output", tmp_path / "pandas")
    assert code == 0, err
    keys = list_keys(out)
    manifest = read_remote_manifest(out, "preprocess")
    parts = manifest[PARTS][INTERACTIONS]
    assert INTERACTIONS not in keys and parts and all(p in manifest["files"] for p in parts)
    assert sorted(keys) == sorted([*manifest["files"], "preprocess_manifest.json",
                                   SUCCESS_MARKER])
    pandas = pq.read_table(tmp_path / "pandas" / INTERACTIONS)
    assert pandas.num_rows > 0 and _parts_table(out).equals(pandas)
    assert manifest["counts"] == read_manifest(tmp_path / "pandas", "preprocess")["counts"]
    # nothing left beside the output: the staging prefix is removed once published
    assert [k for k in list_keys(f"s3://{s3_bucket}") if not k.startswith(("raw/", "interactions/"))
            ] == []

    # the split reads the parts where they lie (Spark) or downloaded (pandas): equal splits
    code, _, err = cli("split", "--input", out, "--output", f"s3://{s3_bucket}/split",
                       "--engine", "spark")
    assert code == 0, err
    code, _, err = cli("split", "--input", out, "--output", tmp_path / "split-pandas")
    assert code == 0, err
    download_dir(f"s3://{s3_bucket}/split", tmp_path / "split-spark")
    assert_same_split(tmp_path / "split-spark", tmp_path / "split-pandas")
    # ... written as parts by the tasks (no NPZ), of which each rank reads its share's groups
    manifest = read_remote_manifest(f"s3://{s3_bucket}/split", "dataset")
    assert len(manifest[PART_FILES]["train.parquet"]) > 1
    whole = load_split(tmp_path / "split-pandas").train
    for share in range(3):
        users = user_share(whole.shape[0], 3, share)
        part = load_split(tmp_path / "split-spark", train_share=(share, 3))
        assert part.train_first == users.start
        assert (part.train != whole[users.start:users.stop]).nnz == 0
        assert (whole[users.start:users.stop].nnz <= part.train_rows_read
                <= whole[users.start:users.stop].nnz + 2 * row_group_rows(whole.nnz))
        assert part.train_rows_read < whole.nnz


def test_a_failed_spark_split_publishes_nothing(cli, s3_bucket: str, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The tasks wrote the split's parts; the driver fails before its manifest: no output,
    and the staging prefix with the parts is gone."""
    interactions(tmp_path / "in", _pairs(False))
    upload_dir(tmp_path / "in", f"s3://{s3_bucket}/in", first="preprocess_manifest.json")
    written: list[str] = []

    def fail(*args: object, **kwargs: Any) -> None:
        written.extend(kwargs["written"])
        raise RuntimeError("killed before the manifest")

    monkeypatch.setattr("vaecf.data.spark.split.write_split_manifest", fail)
    with pytest.raises(RuntimeError, match="killed before the manifest"):
        cli("split", "--input", f"s3://{s3_bucket}/in", "--output", f"s3://{s3_bucket}/out",
            "--engine", "spark")
    assert any(name.startswith("train/part-") for name in written)
    assert [k for k in list_keys(f"s3://{s3_bucket}") if not k.startswith("in/")] == []


def test_a_failed_spark_stage_publishes_nothing(cli, s3_bucket: str,  # type: ignore[no-untyped-def]
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The tasks wrote their parts; the stage fails before its manifest: no output, and the
    staging prefix with the parts is gone."""
    raw = _synthetic(cli, s3_bucket)

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("killed before the manifest")

    monkeypatch.setattr("vaecf.stages.preprocess.write_manifest", fail)
    with pytest.raises(RuntimeError, match="killed before the manifest"):
        cli("preprocess", "--input", raw, "--output", f"s3://{s3_bucket}/out", "--engine",
            "spark")
    assert [k for k in list_keys(f"s3://{s3_bucket}") if not k.startswith("raw/")] == []


def test_the_tasks_check_the_input_checksums(cli, s3_bucket: str) -> None:  # type: ignore[no-untyped-def]
    raw = _synthetic(cli, s3_bucket)
    s3 = boto3.client("s3")
    body = s3.get_object(Bucket=s3_bucket, Key="raw/ratings.csv")["Body"].read()
    s3.put_object(Bucket=s3_bucket, Key="raw/ratings.csv", Body=body.replace(b"\n1,", b"\n2,", 1))
    code, _, err = cli("preprocess", "--input", raw, "--output", f"s3://{s3_bucket}/out",
                       "--engine", "spark")
    assert code == 1
    assert err.strip().endswith(f"{raw}/ratings.csv: SHA-256 does not match "
                                "download_manifest.json")
    assert [k for k in list_keys(f"s3://{s3_bucket}") if not k.startswith("raw/")] == []
