"""``vaecf preprocess`` end to end on files the test writes, downloaded by ``vaecf download``."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import stage_checks

from vaecf.io import read_manifest

HEADER = b"userId,movieId,rating,timestamp\n"


def _ratings() -> bytes:
    """Hand-made: users 10..50 like items 1..5; user 60 likes 1..4 and 6 (item 6 has one
    user); user 70 dislikes 1..5; user 10 rates item 1 twice."""
    rows = [(u, i, 4.0) for u in (10, 20, 30, 40, 50) for i in (1, 2, 3, 4, 5)]
    rows += [(60, i, 5.0) for i in (1, 2, 3, 4, 6)] + [(70, i, 3.0) for i in (1, 2, 3, 4, 5)]
    rows += [(10, 1, 5.0)]
    return HEADER + b"".join(b"%d,%d,%.1f,1000\n" % row for row in rows[::-1])


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def download(cli, tmp_path: Path, name: str, data: bytes,  # type: ignore[no-untyped-def]
             dataset: str = "ml-20m") -> Path:
    """Publish ``data`` as file ``name`` of ``dataset`` with the real download stage."""
    source = tmp_path / "source"
    source.mkdir(parents=True, exist_ok=True)
    (source / name).write_bytes(data)
    code, _, err = cli("download", "--dataset", dataset, "--source", source / name,
                       "--output", tmp_path / "raw")
    assert code == 0, err
    return tmp_path / "raw"


assert_failed = partial(stage_checks.assert_failed, "preprocess")


def test_mission_counts_every_step(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    raw = download(cli, tmp_path, "ml-latest-small.zip",
                   _zip({"ml-latest-small/ratings.csv": _ratings()}), "ml-latest-small")
    code, _, err = cli("preprocess", "--input", raw, "--output", tmp_path / "out")
    assert code == 0, err
    frame = pq.read_table(tmp_path / "out" / "interactions.parquet").to_pandas()
    assert list(frame.columns) == ["user_id", "item_id"]
    assert list(zip(frame["user_id"], frame["item_id"], strict=True)) == [
        (u, i) for u in (10, 20, 30, 40, 50) for i in (1, 2, 3, 4, 5)]
    manifest = read_manifest(tmp_path / "out", "preprocess")
    assert (manifest["dataset"], manifest["layout"], manifest["release"]) == (
        "ml-latest-small", "ratings.csv", "ml-latest-small")
    assert manifest["counts"] == {
        "raw": {"rows": 36, "users": 7, "items": 6},
        "implicit": {"rows": 31, "users": 6, "items": 6},
        "duplicates": 1,
        "dedup": {"rows": 30, "users": 6, "items": 6},
        "item_filter": {"rows": 29, "users": 6, "items": 5},
        "user_filter": {"rows": 25, "users": 5, "items": 5},
        "output": {"rows": 25, "users": 5, "items": 5},
    }
    assert manifest["parameters"]["min_item_users"] == 5


def test_paper_does_not_filter_items_and_reruns_are_identical(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    raw = download(cli, tmp_path, "ratings.csv", _ratings())
    for name in ("a", "b"):
        code, _, err = cli("preprocess", "--input", raw, "--output", tmp_path / name,
                           "--protocol", "paper")
        assert code == 0, err
    data = [(tmp_path / n / "interactions.parquet").read_bytes() for n in ("a", "b")]
    assert data[0] == data[1]
    manifests = [json.loads((tmp_path / n / "preprocess_manifest.json").read_text())
                 for n in ("a", "b")]
    assert manifests[0].pop("run") and manifests[1].pop("run")
    assert manifests[0] == manifests[1]
    assert manifests[0]["counts"]["output"] == {"rows": 30, "users": 6, "items": 6}


BAD_CSV = [  # an empty file or a bad header fails at download (test_movielens_releases.py)
    ("header only", HEADER, "ratings.csv: no data rows"),
    ("non-numeric id", HEADER + b"1,2,4.0,5\n1,two,4.0,5\n",
     "ratings.csv: line 3: column 'movieId': 'two' is not an integer"),
    ("NaN rating", HEADER + b"1,2,NaN,5\n", "ratings.csv: line 2: column 'rating': 'NaN'"),
    ("rating out of range", HEADER + b"1,2,4.0,5\n1,3,9.5,5\n",
     "ratings.csv: line 3: column 'rating': '9.5' is not in 0.5..5"),
    ("last line cut", HEADER + b"1,2,4.0,5\n1,3,4.",
     "ratings.csv: line 3: expected 4 fields", "last line cut short"),
    ("non-UTF-8", HEADER + b"1,2,4.0,5\n1,\xe93,4.0,5\n",
     "ratings.csv: line 3: bytes are not UTF-8"),
]


@pytest.mark.parametrize("case", BAD_CSV, ids=[case[0] for case in BAD_CSV])
def test_bad_ratings_file(cli, tmp_path: Path, case: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    _, content, *expected = case
    raw = download(cli, tmp_path, "ml-25m.zip", _zip({"ml-25m/ratings.csv": content}),
                   "movielens")
    result = cli("preprocess", "--input", raw, "--output", tmp_path / "out")
    assert_failed(result, tmp_path / "out", "ml-25m.zip:ml-25m/ratings.csv", *expected)


def _parquet_bytes(columns: dict[str, list[object]]) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns), buffer, row_group_size=2)
    return buffer.getvalue()


PINS = b"0\t9\t1\n"  # a good pinterest-20.test.rating
TABLE = ("--user-column", "user", "--item-column", "item")
BAD_FILES = [  # (case, dataset, files, download flags, expected): the other layouts' faults
    ("netflix rating out of range", "netflix",
     {"combined_data_1.txt": b"1:\n5,3,2005-01-01\n2:\n5,6,2005-01-01\n"}, (),
     "combined_data_1.txt: line 4: column 'rating': '6' is not in 1..5"),
    ("netflix first line not a movie", "netflix",
     {"combined_data_1.txt": b"5,3,2005-01-01\n1:\n6,9,2005-01-01\n"}, (),
     "combined_data_1.txt: line 1: expected a 'MovieID:' line"),
    ("netflix empty line", "netflix",
     {"combined_data_1.txt": b"1:\n5,3,2005-01-01\n\n6,3,2005-01-01\n"}, (),
     "combined_data_1.txt: line 3: expected 3 fields (customer_id, rating, date), got 1"),
    ("netflix movies only", "netflix", {"combined_data_2.txt": b"1:\n2:\n"}, (),
     "combined_data_2.txt: no data rows (header only?)"),
    ("netflix second file", "netflix",
     {"combined_data_1.txt": b"1:\n5,3,2005-01-01\n",
      "combined_data_2.txt": b"2:\n5,3,2005-01-01\n3:\nx,3,2005-01-01\n"}, (),
     "combined_data_2.txt: line 4: column 'customer_id': 'x' is not an integer"),
    ("lastfm negative plays", "lastfm",
     {"usersha1-artmbid-artname-plays.tsv": b"u1\tm\tA\t1\nu1\tn\tB\t-4\n"}, (),
     "usersha1-artmbid-artname-plays.tsv: line 2: column 'plays': '-4' is not a play count"),
    ("lastfm user not UTF-8", "lastfm",
     {"usersha1-artmbid-artname-plays.tsv": b"u1\tm\tA\t1\nu\xff2\tm\tA\t1\n"}, (),
     "usersha1-artmbid-artname-plays.tsv: line 2: bytes are not UTF-8"),
    ("pinterest item not an integer", "pinterest",
     {"pinterest-20.train.rating": b"0\t1\t1\n0\tx\t1\n", "pinterest-20.test.rating": PINS},
     (), "pinterest-20.train.rating: line 2: column 'item': 'x' is not an integer"),
    ("pinterest 5 fields", "pinterest",
     {"pinterest-20.train.rating": b"0\t1\t1\t5\t6\n", "pinterest-20.test.rating": PINS},
     (), "pinterest-20.train.rating: line 1: expected 3 or 4 tab-separated fields"),
    ("table csv quoted id", "table", {"a.csv": b'user,item\nu,i\n"007",j\n'}, TABLE,
     "a.csv: line 3: column 'user': '\"007\"' holds a quote"),
    ("table csv rating not a number", "table",
     {"a.csv": b"user,item,stars\nu,i,4\nu,j,x\n"}, (*TABLE, "--value-column", "stars",
                                                     "--value-kind", "rating"),
     "a.csv: line 3: column 'stars': 'x' is not a number"),
    ("table parquet first fault", "table",  # row 4 holds an empty id, row 5 a null: nulls first
     {"a.parquet": _parquet_bytes({"user": ["u", "v", "w", "", None], "item": list("ijklm"),
                                   "n": [1.0, 2.5, 3.0, 4.0, 5.0]})},
     (*TABLE, "--value-column", "n", "--value-kind", "plays"),
     "a.parquet: row 5: column 'user': empty (null)"),
    ("table parquet fractional plays", "table",
     {"a.parquet": _parquet_bytes({"user": ["u", "v", "w"], "item": [1, 2, 3],
                                   "n": [1.0, 2.0, 2.5]})},
     (*TABLE, "--value-column", "n", "--value-kind", "plays"),
     "a.parquet: row 3: column 'n': 2.5 is not a play count (an integer >= 0)"),
]


def download_files(cli, tmp_path: Path, dataset: str,  # type: ignore[no-untyped-def]
                   files: dict[str, bytes], *flags: str) -> Path:
    """Publish ``files`` (a folder) as ``dataset`` with the real download stage."""
    source = tmp_path / "source"
    source.mkdir(parents=True)
    for name, data in files.items():
        (source / name).write_bytes(data)
    code, _, err = cli("download", "--dataset", dataset, "--source", source, *flags,
                       "--output", tmp_path / "raw")
    assert code == 0, err
    return tmp_path / "raw"


@pytest.mark.parametrize("case", BAD_FILES, ids=[case[0] for case in BAD_FILES])
def test_bad_data_file(cli, tmp_path: Path, case: tuple) -> None:  # type: ignore[no-untyped-def]
    _, dataset, files, flags, expected = case
    raw = download_files(cli, tmp_path, dataset, files, *flags)
    assert_failed(cli("preprocess", "--input", raw, "--output", tmp_path / "out"),
                  tmp_path / "out", expected)


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_damaged_archive(cli, tmp_path: Path, damage: str) -> None:  # type: ignore[no-untyped-def]
    data = _zip({"ml-25m/ratings.csv": HEADER + b"".join(
        b"%d,%d,4.0,1\n" % (u, u * 13 % 997) for u in range(40_000))})
    if damage == "truncated":
        data = data[: len(data) * 2 // 3]
    else:
        data = data[:200] + bytes(b ^ 0x5A for b in data[200:400]) + data[400:]
    (tmp_path / "ml-25m.zip").write_bytes(data)
    # Download lists the zip and reads its ratings file's first line: both damages show.
    result = cli("download", "--dataset", "movielens", "--source", tmp_path / "ml-25m.zip",
                 "--output", tmp_path / "raw")
    stage_checks.assert_failed("download", result, tmp_path / "raw",
                               f"{tmp_path / 'ml-25m.zip'}: archive ml-25m.zip is corrupt or "
                               "truncated")


def test_every_user_filtered_out(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    raw = download(cli, tmp_path, "ratings.csv", _ratings())
    result = cli("preprocess", "--input", raw, "--output", tmp_path / "out",
                 "--min-user-items", 50)
    assert_failed(result, tmp_path / "out", "every user was filtered out",
                  "--min-user-items 50")


def test_input_manifest_missing_or_not_matching(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    raw = download(cli, tmp_path, "ratings.csv", _ratings())
    (raw / "ratings.csv").write_bytes(_ratings() + b"80,1,5.0,1\n")
    result = cli("preprocess", "--input", raw, "--output", tmp_path / "out")
    assert_failed(result, tmp_path / "out", "ratings.csv: SHA-256 does not match")
    (raw / "download_manifest.json").unlink()
    result = cli("preprocess", "--input", raw, "--output", tmp_path / "out")
    assert_failed(result, tmp_path / "out", "download_manifest.json: manifest missing")


def test_bad_flags(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    raw = download(cli, tmp_path, "ratings.csv", _ratings())
    for flags, expected in ((["--protocol", "best"], "--protocol: unknown protocol 'best'"),
                            (["--min-item-users", "-1"], "--min-item-users -1: expected 0..")):
        result = cli("preprocess", "--input", raw, "--output", tmp_path / "out", *flags)
        assert_failed(result, tmp_path / "out", expected)


def test_unwritable_output(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    raw = download(cli, tmp_path, "ratings.csv", _ratings())
    (tmp_path / "file").write_text("not a directory")
    output = tmp_path / "file" / "out"
    assert_failed(cli("preprocess", "--input", raw, "--output", output), output,
                  f"{output}: output is not writable")


def test_netflix_lastfm_and_pinterest_through_the_stage(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    netflix = b"".join(b"%d:\n" % m + b"".join(b"%d,5,2005-01-01\n" % u for u in range(1, 7))
                       for m in range(1, 7))
    raw = download(cli, tmp_path / "nf", "combined_data_1.txt", netflix, "netflix")
    assert cli("preprocess", "--input", raw, "--output", tmp_path / "nf-out")[0] == 0
    assert read_manifest(tmp_path / "nf-out", "preprocess")["counts"]["output"] == {
        "rows": 36, "users": 6, "items": 6}
    lastfm = b"".join(b"u%d\tm%d\tA\t%d\n" % (u, i, u) for u in range(8) for i in range(5))
    raw = download(cli, tmp_path / "fm", "usersha1-artmbid-artname-plays.tsv", lastfm, "lastfm")
    code, _, err = cli("preprocess", "--input", raw, "--output", tmp_path / "fm-out",
                       "--min-plays", 2)
    assert code == 0, err
    frame = pq.read_table(tmp_path / "fm-out" / "interactions.parquet").to_pandas()
    assert sorted(set(frame["user_id"])) == ["u2", "u3", "u4", "u5", "u6", "u7"]  # u0, u1 < 2
    pins = tmp_path / "pins"
    pins.mkdir()
    (pins / "pinterest-20.train.rating").write_bytes(
        b"".join(b"%d\t%d\t1\n" % (u, i) for u in range(5) for i in range(5)))
    (pins / "pinterest-20.test.rating").write_bytes(b"".join(b"%d\t9\t1\n" % u for u in range(5)))
    assert cli("download", "--dataset", "pinterest", "--source", pins,
               "--output", tmp_path / "pin-raw")[0] == 0
    assert cli("preprocess", "--input", tmp_path / "pin-raw", "--output",
               tmp_path / "pin-out")[0] == 0
    assert read_manifest(tmp_path / "pin-out", "preprocess")["counts"]["output"] == {
        "rows": 30, "users": 5, "items": 6}


def test_sigkill_leaves_no_partial_output(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    n = 3_000_000
    table = pa.table({"userId": rng.integers(1, 50_000, n), "movieId": rng.integers(1, 5_000, n),
                      "rating": np.full(n, 4.0), "timestamp": np.ones(n, dtype=np.int64)})
    source = tmp_path / "source"
    source.mkdir()
    pacsv.write_csv(table, source / "ratings.csv",
                    write_options=pacsv.WriteOptions(quoting_style="none"))
    assert cli("download", "--dataset", "ml-20m", "--source", source / "ratings.csv",
               "--output", tmp_path / "raw")[0] == 0
    output = tmp_path / "out"
    command = [sys.executable, "-m", "vaecf.cli", "preprocess", "--input", str(tmp_path / "raw"),
               "--output", str(output)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while process.poll() is None and not list(tmp_path.glob(".out.staging-*")):
        time.sleep(0.002)  # poll until the stage is inside its publish block
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL
    assert list(tmp_path.glob(".out.staging-*")), "the stage was killed mid-way"
    assert not output.exists()
    rerun = subprocess.run(command, capture_output=True, text=True, check=False)
    assert rerun.returncode == 0, rerun.stderr
    assert read_manifest(output, "preprocess")["counts"]["raw"]["rows"] == n


@pytest.mark.parametrize("name", ["../elsewhere/ratings.csv", "{tmp}/elsewhere/ratings.csv"])
def test_a_download_name_outside_the_input_is_refused(cli, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                      name: str) -> None:
    raw = download(cli, tmp_path, "ratings.csv", _ratings(), "movielens")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "ratings.csv").write_bytes(_ratings())  # unchecked bytes
    path = raw / "download_manifest.json"
    manifest = json.loads(path.read_text())
    manifest["downloads"][0]["name"] = name.format(tmp=tmp_path)
    path.write_text(json.dumps(manifest))
    assert_failed(cli("preprocess", "--input", raw, "--output", tmp_path / "out"),
                  tmp_path / "out", "download_manifest.json: downloads[].name",
                  "elsewhere/ratings.csv")


def test_a_manifest_entry_outside_the_input_is_refused(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    raw = download(cli, tmp_path, "ratings.csv", _ratings(), "movielens")
    (tmp_path / "secret").write_bytes(b"x")
    path = raw / "download_manifest.json"
    manifest = json.loads(path.read_text())
    manifest["files"]["../secret"] = {"sha256": "0" * 64, "bytes": 1}
    path.write_text(json.dumps(manifest))
    assert_failed(cli("preprocess", "--input", raw, "--output", tmp_path / "out"),
                  tmp_path / "out", "'../secret' is not a path inside its folder")


@pytest.mark.parametrize("member", ["../ml-latest-small/ratings.csv",
                                    "/ml-latest-small/ratings.csv"])
def test_an_archive_member_outside_the_archive_is_refused(cli, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                          member: str) -> None:
    data = _zip({"ml-latest-small/ratings.csv": _ratings(), member: _ratings()})
    code, _, err = cli("download", "--dataset", "ml-latest-small", "--source",
                       _save(tmp_path, "ml-latest-small.zip", data), "--output", tmp_path / "raw")
    assert code == 1 and f"ml-latest-small.zip: {member!r} is not a path inside" in err, err
    assert not (tmp_path / "raw").exists()


def _save(tmp_path: Path, name: str, data: bytes) -> Path:
    (tmp_path / name).write_bytes(data)
    return tmp_path / name


def test_an_input_that_is_a_link_loop_is_one_line(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert_failed(cli("preprocess", "--input", loop, "--output", tmp_path / "out"),
                  tmp_path / "out", f"{loop} is a symbolic link to nothing")
