"""``--dataset table``: a user's own Parquet or CSV interactions, downloaded from a file, a
folder or an ``s3://`` prefix (moto on loopback) and preprocessed with the columns named at
download. Every file is written by the test with the real pyarrow writers."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import stage_checks

from vaecf.io import read_manifest

IMPLICIT = ("--user-column", "user", "--item-column", "item")
KEEP_ALL = ("--min-user-items", "1", "--min-item-users", "1")

download_failed = partial(stage_checks.assert_failed, "download")
preprocess_failed = partial(stage_checks.assert_failed, "preprocess")


def _parquet(path: Path, columns: dict[str, list[object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def _text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _pairs(output: Path) -> list[tuple[str, str]]:
    table = pq.read_table(output / "interactions.parquet")
    assert table.schema.field("user_id").type == pa.string()
    assert table.schema.field("item_id").type == pa.string()
    return list(zip(table["user_id"].to_pylist(), table["item_id"].to_pylist(), strict=True))


def _without_run(path: Path) -> dict[str, object]:
    manifest = json.loads(path.read_text())
    manifest.pop("run")
    manifest["inputs"].pop("input", None)
    manifest["inputs"].pop("source", None)
    return manifest


def _log_folder(root: Path) -> Path:
    """Two Parquet files in a folder and its subfolder, as Spark writes them (with _SUCCESS
    and .crc files, which are not data): user "007" and "7" are two users; b.parquet's
    integer ids are read as decimal text, so its user 7 is a.parquet's "7"."""
    logs = root / "logs"
    _parquet(logs / "a.parquet", {"user": ["007", "7", "007", "7", "x"],
                                  "item": ["i1", "i1", "i2", "i3", "i1"],
                                  "ts": [1, 2, 3, 4, 5]})
    _parquet(logs / "2024" / "b.parquet", {"user": [7, 8], "item": [10, 10], "ts": [6, 7]})
    _text(logs / "_SUCCESS", "")
    _text(logs / ".a.parquet.crc", "crc")
    return logs


def test_a_parquet_folder_with_text_ids(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = _log_folder(tmp_path)
    code, out, err = cli("download", "--dataset", "table", "--source", logs, *IMPLICIT,
                         "--output", tmp_path / "raw")
    assert code == 0, err
    assert "table: 2 files (parquet)" in out
    manifest = read_manifest(tmp_path / "raw", "download")
    assert manifest["data_files"] == ["2024/b.parquet", "a.parquet"]
    assert (manifest["layout"], manifest["counts"]["files"]) == ("parquet", 2)
    record = {"user_column": "user", "item_column": "item", "value_column": None,
              "value_kind": "implicit"}
    assert manifest["table"] == record
    assert {k: manifest["parameters"][k] for k in record} == record
    code, _, err = cli("preprocess", "--input", tmp_path / "raw", "--output", tmp_path / "pre",
                       *KEEP_ALL)
    assert code == 0, err
    assert _pairs(tmp_path / "pre") == [("007", "i1"), ("007", "i2"), ("7", "10"), ("7", "i1"),
                                        ("7", "i3"), ("8", "10"), ("x", "i1")]
    manifest = read_manifest(tmp_path / "pre", "preprocess")
    assert (manifest["dataset"], manifest["layout"], manifest["table"]) == (
        "table", "parquet", record)
    assert manifest["files_read"] == ["2024/b.parquet", "a.parquet"]
    assert manifest["counts"]["raw"] == {"rows": 7, "users": 4, "items": 4}
    assert manifest["counts"]["output"] == {"rows": 7, "users": 4, "items": 4}


def test_rerunning_gives_byte_identical_outputs(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = _log_folder(tmp_path)
    for run in ("1", "2"):
        code, _, err = cli("download", "--dataset", "table", "--source", f"file://{logs}",
                           *IMPLICIT, "--output", tmp_path / f"raw{run}")
        assert code == 0, err
        code, _, err = cli("preprocess", "--input", tmp_path / f"raw{run}",
                           "--output", tmp_path / f"pre{run}", *KEEP_ALL)
        assert code == 0, err
    for stage, name in (("raw", "download_manifest.json"), ("pre", "preprocess_manifest.json")):
        assert _without_run(tmp_path / f"{stage}1" / name) == _without_run(
            tmp_path / f"{stage}2" / name)
    assert (tmp_path / "pre1" / "interactions.parquet").read_bytes() == (
        tmp_path / "pre2" / "interactions.parquet").read_bytes()


def test_a_csv_file_of_ratings(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Extra columns, any order; "0042" and "42" are two customers; ratings on a 1..10 scale.
    source = _text(tmp_path / "ratings.csv", "ts,sku,customer,stars\n"
                   "1,A-1,0042,9\n2,A-2,0042,3.5\n3,A-1,42,7\n4,B,42,6.9\n5,B,0042,10\n")
    code, _, err = cli("download", "--dataset", "table", "--source", source,
                       "--user-column", "customer", "--item-column", "sku",
                       "--value-column", "stars", "--value-kind", "rating",
                       "--output", tmp_path / "raw")
    assert code == 0, err
    assert read_manifest(tmp_path / "raw", "download")["layout"] == "csv"
    code, _, err = cli("preprocess", "--input", tmp_path / "raw", "--output", tmp_path / "pre",
                       "--min-rating", "7", *KEEP_ALL)
    assert code == 0, err
    assert _pairs(tmp_path / "pre") == [("0042", "A-1"), ("0042", "B"), ("42", "A-1")]
    counts = read_manifest(tmp_path / "pre", "preprocess")["counts"]
    assert (counts["raw"], counts["implicit"]) == ({"rows": 5, "users": 2, "items": 3},
                                                   {"rows": 3, "users": 2, "items": 2})


def test_a_csv_folder_of_play_counts(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _text(tmp_path / "plays" / "p1.csv", "user,item,n\nu1,a,0\nu1,b,3\n")
    _text(tmp_path / "plays" / "more" / "p2.csv", "user,item,n\nu2,a,2\nu2,b,1\n")
    code, _, err = cli("download", "--dataset", "table", "--source", tmp_path / "plays",
                       *IMPLICIT, "--value-column", "n", "--value-kind", "plays",
                       "--output", tmp_path / "raw")
    assert code == 0, err
    code, _, err = cli("preprocess", "--input", tmp_path / "raw", "--output", tmp_path / "pre",
                       "--min-plays", "2", *KEEP_ALL)
    assert code == 0, err
    assert _pairs(tmp_path / "pre") == [("u1", "b"), ("u2", "a")]


def test_an_s3_prefix_of_parquet_files(cli, s3_bucket: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s3 = boto3.client("s3")
    logs = _log_folder(tmp_path)
    for path in sorted(p for p in logs.rglob("*") if p.is_file()):
        s3.put_object(Bucket=s3_bucket, Key=f"events/{path.relative_to(logs).as_posix()}",
                      Body=path.read_bytes())
    s3.put_object(Bucket=s3_bucket, Key="events/2025/", Body=b"")  # a console's folder marker
    code, _, err = cli("download", "--dataset", "table", "--source",
                       f"s3://{s3_bucket}/events/", *IMPLICIT,
                       "--output", f"s3://{s3_bucket}/raw")
    assert code == 0, err
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix="raw/")["Contents"]}
    assert keys == {"raw/a.parquet", "raw/2024/b.parquet", "raw/download_manifest.json",
                    "raw/_SUCCESS"}
    code, _, err = cli("preprocess", "--input", f"s3://{s3_bucket}/raw",
                       "--output", tmp_path / "pre", *KEEP_ALL)
    assert code == 0, err
    assert ("007", "i1") in _pairs(tmp_path / "pre") and ("7", "i1") in _pairs(tmp_path / "pre")
    assert len(_pairs(tmp_path / "pre")) == 7


@pytest.mark.parametrize(("prefix", "key"), [
    ("climbs", "../../evil/x.parquet"), ("absolute", "/{tmp}/evil.parquet"),
    ("long", "k" * 300 + ".parquet")])
def test_a_hostile_key_is_refused_before_anything_is_written(  # type: ignore[no-untyped-def]
        cli, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix: str,
        key: str) -> None:
    # One bucket for the three cases (its name is cut to 40 characters): a prefix each.
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # "../../evil" from out/'s staging area (work/.out.staging-*/out/)
    s3 = boto3.client("s3")
    good = _parquet(tmp_path / "good.parquet", {"user": ["u"], "item": ["i"]}).read_bytes()
    s3.put_object(Bucket=s3_bucket, Key=f"{prefix}/good.parquet", Body=good)
    evil = key.format(tmp=tmp_path)
    s3.put_object(Bucket=s3_bucket, Key=f"{prefix}/{evil}", Body=good)
    result = cli("download", "--dataset", "table", "--source", f"s3://{s3_bucket}/{prefix}/",
                 *IMPLICIT, "--output", "out")
    download_failed(result, work / "out", f"s3://{s3_bucket}/{prefix}/: {repr(evil[:60])[:-1]}",
                    "refused, nothing read or written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.parquet", "work"]
    assert list(work.iterdir()) == []


def _parquet_without_user(path: Path) -> Path:
    return _parquet(path, {"customer": ["u"], "item": ["i"]})


@pytest.mark.parametrize(("files", "expected"), [
    ({"a.csv": "customer,item\nu,i\n"},
     "a.csv: line 1: missing column 'user' (header is 'customer,item'; expected user, item)"),
    ({"x/a.parquet": _parquet_without_user},
     "x/a.parquet: missing column(s) user (found customer, item)"),
    ({"a.parquet": lambda p: _parquet(p, {"user": [1.5], "item": ["i"]})},
     "a.parquet: column user holds double, expected integers or text"),
    ({"a.csv": ""}, "a.csv: file is empty"),
    ({"a.csv": "user,item\n"}, "a.csv: no data rows (header only?)"),
    ({"a.parquet": lambda p: _parquet(p, {"user": pa.array([], pa.string()),
                                          "item": pa.array([], pa.string())})},
     "a.parquet: no data rows"),
    ({"a.parquet": lambda p: _text(p, "not parquet")}, "a.parquet: not a readable Parquet file"),
    ({"a.csv": "user,item\nu,i\n", "b.parquet": lambda p: _parquet(p, {"user": ["u"],
                                                                        "item": ["i"]})},
     "mixed formats (a.csv is CSV, b.parquet is Parquet); a table dataset is of one format"),
    ({}, "source directory holds no *.parquet or *.csv files among its 0 files"),
    ({"events.json": "{}", "logs.zip": "PK"},
     "source directory holds no *.parquet or *.csv files among its 2 files"),
], ids=["csv-missing-column", "parquet-missing-column", "float-ids", "empty-csv",
        "header-only", "parquet-no-rows", "not-parquet", "mixed-formats", "empty-folder",
        "no-data-files"])
def test_bad_input_fails_at_download(cli, tmp_path: Path, files: dict[str, object],  # type: ignore[no-untyped-def]
                                     expected: str) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name, content in files.items():
        if callable(content):
            content(source / name)
        else:
            _text(source / name, str(content))
    download_failed(cli("download", "--dataset", "table", "--source", source, *IMPLICIT,
                        "--output", tmp_path / "raw"), tmp_path / "raw", expected)


def test_an_empty_s3_prefix(cli, s3_bucket: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="logs/_SUCCESS", Body=b"")
    download_failed(cli("download", "--dataset", "table", "--source", f"s3://{s3_bucket}/logs/",
                        *IMPLICIT, "--output", tmp_path / "raw"), tmp_path / "raw",
                    f"s3://{s3_bucket}/logs/: no *.parquet or *.csv files under this prefix")


@pytest.mark.parametrize(("name", "content", "value", "expected"), [
    ("a.csv", "user,item,stars\nu,i,4\nu,j,x\n", ("stars", "rating"),
     "a.csv: line 3: column 'stars': 'x' is not a number"),
    ("a.csv", "user,item,stars\nu,i,4\nu,j,nan\n", ("stars", "rating"),
     "a.csv: line 3: column 'stars': 'nan' is not a finite number"),
    ("a.csv", "user,item,n\nu,i,4\nu,j,-1\n", ("n", "plays"),
     "a.csv: line 3: column 'n': '-1' is not a play count (an integer >= 0)"),
    ("a.csv", "user,item\nu,i\n,j\n", None, "a.csv: line 3: column 'user': empty"),
    ("a.csv", 'user,item\nu,i\n"007",j\n', None,
     "a.csv: line 3: column 'user': '\"007\"' holds a quote"),
    ("a.csv", "user,item\nu,i\nv,j,k\n", None,
     "a.csv: line 3: expected 2 fields (user, item), got 3"),
    ("a.parquet", {"user": ["u", None], "item": ["i", "j"]}, None,
     "a.parquet: row 2: column 'user': empty (null)"),
    ("a.parquet", {"user": ["u", "v", ""], "item": ["i", "j", "k"]}, None,
     "a.parquet: row 3: column 'user': empty"),
    ("a.parquet", {"user": ["u", "v"], "item": ["i", "j"], "n": [1.0, 2.5]}, ("n", "plays"),
     "a.parquet: row 2: column 'n': 2.5 is not a play count (an integer >= 0)"),
    ("a.parquet", {"user": ["u", "v"], "item": ["i", "j"], "r": [float("inf"), 2.0]},
     ("r", "rating"), "a.parquet: row 1: column 'r': inf is not a finite number"),
], ids=["csv-not-a-number", "csv-nan", "csv-negative-plays", "csv-empty-id", "csv-quoted-id",
        "csv-extra-field", "parquet-null-id", "parquet-empty-id", "parquet-fractional-plays",
        "parquet-infinite-rating"])
def test_a_bad_row_fails_preprocess_naming_it(cli, tmp_path: Path, name: str,  # type: ignore[no-untyped-def]
                                              content: object, value: tuple[str, str] | None,
                                              expected: str) -> None:
    path = tmp_path / "source" / name
    if isinstance(content, dict):
        _parquet(path, content)
    else:
        _text(path, str(content))
    flags = ("--value-column", value[0], "--value-kind", value[1]) if value else ()
    code, _, err = cli("download", "--dataset", "table", "--source", path, *IMPLICIT, *flags,
                       "--output", tmp_path / "raw")
    assert code == 0, err  # download reads headers and footers; every row is preprocess's
    preprocess_failed(cli("preprocess", "--input", tmp_path / "raw",
                          "--output", tmp_path / "pre", *KEEP_ALL), tmp_path / "pre", expected)


@pytest.mark.parametrize(("argv", "expected"), [
    (["--dataset", "table", "--source", "{src}"],
     "--user-column and --item-column: required for dataset 'table'"),
    (["--dataset", "table", "--source", "{src}", *IMPLICIT, "--value-kind", "plays"],
     "--value-kind plays: needs --value-column"),
    (["--dataset", "table", "--source", "{src}", *IMPLICIT, "--value-column", "n"],
     "--value-kind: with --value-column, one of rating, plays (got none)"),
    (["--dataset", "table", "--source", "{src}", *IMPLICIT, "--value-column", "n",
      "--value-kind", "stars"], "--value-kind: with --value-column, one of rating, plays"),
    (["--dataset", "table", "--source", "{src}", "--user-column", "u", "--item-column", "u"],
     "distinct columns, got 'u', 'u'"),
    (["--dataset", "table", *IMPLICIT], "--source: required for dataset 'table'"),
    (["--dataset", "movielens", "--source", "{src}", "--user-column", "u"],
     "--user-column: only for --dataset table"),
])
def test_bad_column_flags(cli, tmp_path: Path, argv: list[str],  # type: ignore[no-untyped-def]
                          expected: str) -> None:
    source = _text(tmp_path / "a.csv", "user,item\nu,i\n")
    argv = [a.format(src=source) for a in argv]
    download_failed(cli("download", *argv, "--output", tmp_path / "raw"), tmp_path / "raw",
                    expected)


def test_help_names_the_table_dataset_and_its_flags(capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    from vaecf.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["download", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "pinterest, synthetic, table" in text
    for flag in ("--user-column", "--item-column", "--value-column", "--value-kind"):
        assert flag in text
    assert "one of: rating, plays" in text


def test_a_download_manifest_without_columns_is_one_line(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source = _text(tmp_path / "a.csv", "user,item\nu,i\n")
    code, _, err = cli("download", "--dataset", "table", "--source", source, *IMPLICIT,
                       "--output", tmp_path / "raw")
    assert code == 0, err
    path = tmp_path / "raw" / "download_manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["table"]["user_column"]
    path.write_text(json.dumps(manifest))
    preprocess_failed(cli("preprocess", "--input", tmp_path / "raw", "--output",
                          tmp_path / "pre"), tmp_path / "pre",
                      f"{path}: table: 'user_column': expected str, found missing")


@pytest.mark.parametrize("name", ["clicks.txt", "clicks.csv.zip"])
def test_a_file_that_is_neither_parquet_nor_csv(cli, tmp_path: Path, name: str) -> None:  # type: ignore[no-untyped-def]
    # The format is the name's: a zip is not opened (nor fetched), whatever it holds.
    source = _text(tmp_path / name, "user,item\nu,i\n")
    download_failed(cli("download", "--dataset", "table", "--source", source, *IMPLICIT,
                        "--output", tmp_path / "raw"), tmp_path / "raw",
                    f"{source}: no *.parquet or *.csv files among {name}")


def test_text_ids_reach_the_split_as_written(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # 60 users "u000".."u059" and their twins "0".."59" (integers in Parquet: decimal text),
    # each with 6 of 12 items: every id a text, none merged with another.
    users = [f"u{u:03d}" for u in range(60) for _ in range(6)]
    items = [f"0{(u + k) % 12}" for u in range(60) for k in range(6)]
    _parquet(tmp_path / "logs" / "a.parquet", {"user": users, "item": items})
    _parquet(tmp_path / "logs" / "b.parquet", {"user": [int(u[1:]) for u in users],
                                               "item": items})
    code, _, err = cli("download", "--dataset", "table", "--source", tmp_path / "logs",
                       *IMPLICIT, "--output", tmp_path / "raw")
    assert code == 0, err
    code, _, err = cli("preprocess", "--input", tmp_path / "raw", "--output", tmp_path / "pre")
    assert code == 0, err
    code, _, err = cli("split", "--input", tmp_path / "pre", "--output", tmp_path / "split")
    assert code == 0, err
    user_index = pq.read_table(tmp_path / "split" / "user_index.parquet")
    item_index = pq.read_table(tmp_path / "split" / "item_index.parquet")
    assert user_index.schema.field("user_id").type == pa.string()
    assert sorted(user_index["user_id"].to_pylist()) == sorted(
        [f"u{u:03d}" for u in range(60)] + [str(u) for u in range(60)])
    assert sorted(item_index["item_id"].to_pylist()) == sorted(f"0{i}" for i in range(12))


# ---- a source folder is read where it lies, and only there

def test_a_link_out_of_the_source_folder_stops_download(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Another tenant's CSV, linked into the folder a pipeline step reads, is never copied."""
    source = tmp_path / "source"
    _text(source / "a.csv", "user,item\nu,i\n")
    secret = _text(tmp_path / "elsewhere" / "secret.csv", "user,item\ntheirs,x\n")
    (source / "b.csv").symlink_to(secret)
    download_failed(cli("download", "--dataset", "table", "--source", source, *IMPLICIT,
                        "--output", tmp_path / "raw"), tmp_path / "raw",
                    "'b.csv' leads out of its folder through a symbolic link")


def test_a_link_inside_the_source_folder_is_read(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source = tmp_path / "source"
    _text(source / "2024" / "a.csv", "user,item\nu,i\n")
    (source / "b.csv").symlink_to(source / "2024" / "a.csv")
    code, _, err = cli("download", "--dataset", "table", "--source", source, *IMPLICIT,
                       "--output", tmp_path / "raw")
    assert code == 0, err
    assert (tmp_path / "raw" / "b.csv").read_text() == "user,item\nu,i\n"


@pytest.fixture()
def copies(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The local files download copies, recorded."""
    from vaecf.data import fetch

    copied: list[Path] = []
    real = fetch._copy_local

    def copy(path: Path, dest: Path) -> None:
        copied.append(path)
        real(path, dest)

    monkeypatch.setattr(fetch, "_copy_local", copy)
    return copied


def test_a_huge_file_without_a_header_is_refused_before_it_is_copied(  # type: ignore[no-untyped-def]
        cli, tmp_path: Path, copies: list[Path]) -> None:
    source = tmp_path / "source"
    _text(source / "a.csv", "user,item\nu,i\n")
    with open(source / "b.csv", "wb") as handle:  # sparse: 256 MiB of NULs, no blocks
        handle.truncate(256 << 20)
    download_failed(cli("download", "--dataset", "table", "--source", source, *IMPLICIT,
                        "--output", tmp_path / "raw"), tmp_path / "raw",
                    "b.csv: line 1: header longer than 64 KiB")
    assert copies == []


def test_a_source_larger_than_the_free_space_is_refused_before_it_is_copied(  # type: ignore[no-untyped-def]
        cli, tmp_path: Path, copies: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(1 << 30, 1 << 30, 10))
    source = tmp_path / "source"
    _text(source / "a.csv", "user,item\nu,i\n")
    download_failed(cli("download", "--dataset", "table", "--source", source, *IMPLICIT,
                        "--output", tmp_path / "raw"), tmp_path / "raw",
                    "14 bytes to copy, 10 free on ")
    assert copies == []


# ---- one id limit, the server's, where ids enter

@pytest.mark.parametrize("name", ["a.csv", "a.parquet"])
@pytest.mark.parametrize("column", ["user", "item"])
def test_an_id_longer_than_serving_takes_is_refused_at_preprocess(  # type: ignore[no-untyped-def]
        cli, tmp_path: Path, name: str, column: str) -> None:
    from vaecf.io.readers import MAX_ID_BYTES

    long = "é" * (MAX_ID_BYTES // 2 + 1)  # 129 characters, 258 bytes of UTF-8
    rows = {"user": ["u1", "u2", "u1"], "item": ["i1", "i1", "i2"]}
    rows[column][0] = long
    source = tmp_path / "source"
    if name.endswith(".csv"):
        _text(source / name, "user,item\n" + "".join(f"{u},{i}\n" for u, i in
                                                     zip(rows["user"], rows["item"], strict=True)))
    else:
        _parquet(source / name, rows)
    code, _, err = cli("download", "--dataset", "table", "--source", source, *IMPLICIT,
                       "--output", tmp_path / "raw")
    assert code == 0, err
    preprocess_failed(cli("preprocess", "--input", tmp_path / "raw", "--output",
                          tmp_path / "out", *KEEP_ALL), tmp_path / "out",
                      f"{name}: {column}_id 'éééé", "is 258 bytes long (an id is at most 256")
