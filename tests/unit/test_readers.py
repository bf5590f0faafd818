"""Readers of native formats: real files and archives written here, hand-checked contents."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from vaecf.data.readers import read_raw
from vaecf.errors import VaecfError

RATINGS = b"userId,movieId,rating,timestamp\n7,31,4.5,100\n7,5,2.0,101\n2,31,5.0,102\n"


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def _tar(path: Path, members: dict[str, bytes], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def _read(reader: str, directory: Path, *names: str):  # type: ignore[no-untyped-def]
    scratch = directory / "scratch"
    scratch.mkdir(exist_ok=True)
    return read_raw(reader, directory, list(names), scratch)


@pytest.mark.parametrize("member", ["ml-20m/ratings.csv", "ml-25m/ratings.csv",
                                    "ml-latest-small/ratings.csv"])
def test_movielens_zip_layouts(tmp_path: Path, member: str) -> None:
    name = member.split("/")[0] + ".zip"
    _zip(tmp_path / name, {member: RATINGS, member.replace("ratings", "movies"): b"x\n"})
    raw = _read("movielens", tmp_path, name)
    assert raw.user_id.tolist() == [7, 7, 2]
    assert raw.item_id.tolist() == [31, 5, 31]
    assert raw.value.tolist() == [4.5, 2.0, 5.0]
    assert raw.kind == "rating"
    assert raw.files == (f"{name}:{member}",)


def test_movielens_plain_file_with_columns_in_another_order(tmp_path: Path) -> None:
    (tmp_path / "ratings.csv").write_bytes(b"rating,timestamp,movieId,userId\n3.5,1,10,4\n")
    raw = _read("movielens", tmp_path, "ratings.csv")
    assert (raw.user_id.tolist(), raw.item_id.tolist(), raw.value.tolist()) == ([4], [10], [3.5])


def test_the_threaded_csv_parser_gets_arrow_memory_not_a_view_of_python_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pyarrow's threaded CSV reader may drop its input on one of Arrow's threads after
    ``read_csv`` returned; a view of Python bytes then takes the GIL there, which aborts a
    process that is exiting (exit 134 after a finished stage, 8 of 520 runs under load). Every
    piece it parses must be Arrow's own copy: a view of Python bytes is read-only."""
    import pyarrow as pa

    from vaecf.data.readers import table

    parsed: list[object] = []
    read_csv = table.pacsv.read_csv

    def spy(source: object, **options: object) -> pa.Table:
        parsed.append(source)
        return read_csv(source, **options)

    monkeypatch.setattr(table.pacsv, "read_csv", spy)
    monkeypatch.setattr(table, "_PIECE_SIZE", 24)  # a few lines per piece: several pieces
    (tmp_path / "ratings.csv").write_bytes(RATINGS + b"9,8,1.5,103\n" * 5)
    raw = _read("movielens", tmp_path, "ratings.csv")
    assert raw.user_id.tolist() == [7, 7, 2] + [9] * 5
    assert len(parsed) > 2
    assert all(isinstance(p, pa.Buffer) and p.is_mutable for p in parsed), parsed
    python_view = pa.py_buffer(RATINGS)
    assert not python_view.is_mutable  # what the check tells apart
    copy = table.arrow_copy(memoryview(RATINGS))
    assert copy.to_pybytes() == RATINGS and copy.address != python_view.address


@pytest.mark.parametrize(("content", "expected"), [
    (b"", "ratings.csv: file is empty"),
    (b"userId,movieId,rating,timestamp\n", "ratings.csv: no data rows"),
    (b"userId,movieId,timestamp\n1,2,3\n", "ratings.csv: line 1: missing column 'rating'"),
    (RATINGS + b"3,abc,4.0,5\n", "ratings.csv: line 5: column 'movieId': 'abc' is not an int"),
    (RATINGS + b"x1,3,4.0,5\n", "ratings.csv: line 5: column 'userId': 'x1' is not an int"),
    (RATINGS + b"3,4,NaN,5\n", "ratings.csv: line 5: column 'rating': 'NaN' is not in 0.5..5"),
    (RATINGS + b"3,4,,5\n", "ratings.csv: line 5: column 'rating': '' is not a number"),
    (RATINGS + b"3,4,7.0,5\n", "ratings.csv: line 5: column 'rating': '7.0' is not in 0.5..5"),
    (RATINGS + b"3,4,0.0,5\n", "ratings.csv: line 5: column 'rating': '0.0' is not in 0.5..5"),
    (RATINGS + b"3,4,4", "ratings.csv: line 5: expected 4 fields (userId, movieId, rating, "
                         "timestamp), got 3 (last line cut short"),
    (RATINGS + b"3,4\xff,4.0,5\n", "ratings.csv: line 5: bytes are not UTF-8"),
    (b"user\xe9Id,movieId,rating\n1,2,3\n", "ratings.csv: line 1: header bytes are not UTF-8"),
])
def test_movielens_bad_input_names_file_line_and_column(tmp_path: Path, content: bytes,
                                                        expected: str) -> None:
    (tmp_path / "ratings.csv").write_bytes(content)
    with pytest.raises(VaecfError) as err:
        _read("movielens", tmp_path, "ratings.csv")
    assert expected in str(err.value)


def test_corrupt_and_truncated_zip(tmp_path: Path) -> None:
    big = b"userId,movieId,rating,timestamp\n" + b"".join(
        b"%d,%d,4.0,1\n" % (i, i * 7 % 1000) for i in range(50_000))
    data = _zip(tmp_path / "good.zip", {"ml-20m/ratings.csv": big}).read_bytes()
    (tmp_path / "cut.zip").write_bytes(data[: len(data) // 2])
    flipped = bytearray(data)
    flipped[len(data) // 3] ^= 0xFF
    (tmp_path / "flipped.zip").write_bytes(bytes(flipped))
    for name in ("cut.zip", "flipped.zip"):
        with pytest.raises(VaecfError, match=f"(archive {name} is corrupt or truncated|{name}:"
                                             f"ml-20m/ratings.csv: line)"):
            _read("movielens", tmp_path, name)


def test_truncated_tarball(tmp_path: Path) -> None:
    rows = b"".join(b"u%d\tm%d\tname\t%d\n" % (i, i, i) for i in range(20_000))
    data = _tar(tmp_path / "x.tar.gz", {"lastfm-dataset-360K/usersha1-artmbid-artname-plays.tsv":
                                        rows}).read_bytes()
    (tmp_path / "cut.tar.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(VaecfError, match=r"archive cut\.tar\.gz is corrupt or truncated"):
        _read("lastfm", tmp_path, "cut.tar.gz")


def test_missing_data_file_is_named(tmp_path: Path) -> None:
    _zip(tmp_path / "ml-20m.zip", {"ml-20m/movies.csv": b"movieId,title\n"})
    with pytest.raises(VaecfError, match=r"no ratings.csv, ratings.dat or u.data among ml-20m"):
        _read("movielens", tmp_path, "ml-20m.zip")


RATINGS_DAT = b"7::31::4::100\n7::5::2::101\n2::31::5::102\n"
U_DATA = b"7\t31\t4\t100\n7\t5\t2\t101\n2\t31\t5\t102\n"


@pytest.mark.parametrize(("member", "data"), [
    ("ml-1m/ratings.dat", RATINGS_DAT),
    ("ml-10M100K/ratings.dat", RATINGS_DAT.replace(b"::4::", b"::4.5::")),
    ("ml-100k/u.data", U_DATA),
])
def test_movielens_dat_and_u_data_layouts(tmp_path: Path, member: str, data: bytes) -> None:
    # ML-100K's u1.base .. ub.test are splits of u.data: reading them too would double rows.
    _zip(tmp_path / "a.zip", {member: data, "ml-100k/u1.base": U_DATA,
                              "ml-1m/movies.dat": b"1::Toy Story::x\n"})
    _zip(tmp_path / "b.zip", {member.split("/")[1]: data})  # at the zip's root
    (tmp_path / member.split("/")[1]).write_bytes(data)  # the same file, plain
    for name in ("a.zip", "b.zip", member.split("/")[1]):
        raw = _read("movielens", tmp_path, name)
        assert raw.user_id.tolist() == [7, 7, 2]
        assert raw.item_id.tolist() == [31, 5, 31]
        assert raw.value.tolist() == [4.5 if "10M" in member else 4.0, 2.0, 5.0]
        assert raw.kind == "rating"


@pytest.mark.parametrize(("name", "content", "expected"), [
    ("ratings.dat", RATINGS_DAT + b"3::4::x::5\n", "line 4: column 'rating': 'x' is not a"),
    ("ratings.dat", RATINGS_DAT + b"3:4::4::5\n", "line 4: expected 4 fields (userId, movieId, "
                                                  "rating, timestamp), got 3"),
    ("ratings.dat", RATINGS_DAT + b"3:NA:4::4::5\n", "line 4: expected 4 fields"),
    ("ratings.dat", RATINGS_DAT + b"3::4::4::5::6\n", "line 4: expected 4 fields"),
    ("ratings.dat", RATINGS_DAT + b"3::4::4::5:\n", "line 4: column 'timestamp': '5:' is not"),
    ("ratings.dat", RATINGS_DAT + b"3,4,4,5\n", "line 4: expected 4 fields"),
    ("ratings.dat", RATINGS_DAT + b"3::4::7::5\n", "line 4: column 'rating': '7' is not in"),
    ("u.data", U_DATA + b"3\t4\t4\n", "line 4: expected 4 fields"),
    ("u.data", U_DATA + b"3\tx\t4\t5\n", "line 4: column 'movieId': 'x' is not an integer"),
    ("u.data", U_DATA + b"3\t4\t4\t5\t\n", "line 4: expected 4 fields"),
])
def test_dat_and_u_data_bad_lines(tmp_path: Path, name: str, content: bytes,
                                  expected: str) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(VaecfError) as err:
        _read("movielens", tmp_path, name)
    assert f"{name}: {expected}" in str(err.value)


BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize(("name", "content", "bad"), [
    ("ratings.csv", RATINGS, b"3,4,9,5\n"), ("ratings.dat", RATINGS_DAT, b"3::4::9::5\n"),
    ("u.data", U_DATA, b"3\t4\t9\t5\n")])
def test_byte_order_mark_is_accepted(tmp_path: Path, name: str, content: bytes,
                                     bad: bytes) -> None:
    (tmp_path / name).write_bytes(BOM + content)
    raw = _read("movielens", tmp_path, name)
    assert raw.user_id.tolist() == [7, 7, 2]
    # ... and a bad line further down is still the one named, not line 1.
    (tmp_path / name).write_bytes(BOM + content + bad)
    line = len(content.splitlines()) + 1
    with pytest.raises(VaecfError, match=f"{name}: line {line}: column 'rating': '9' is not"):
        _read("movielens", tmp_path, name)


@pytest.mark.parametrize(("content", "expected"), [
    (b"userId,movieId,rating,rating,timestamp\n1,2,4.0,3.0,5\n",
     "ratings.csv: line 1: column 'rating' appears 2 times (header is 'userId,movieId,rating,"
     "rating,timestamp')"),
    (b"userId,movieId,rating,timestamp,timestamp\n1,2,4.0,3,5\n",
     "ratings.csv: line 1: column 'timestamp' appears 2 times"),
    (RATINGS + b"99999999999999999999,3,4.0,5\n",
     "ratings.csv: line 5: column 'userId': '99999999999999999999' does not fit in a 64-bit"),
    (RATINGS + b"1,-9223372036854775809,4.0,5\n",
     "ratings.csv: line 5: column 'movieId': '-9223372036854775809' does not fit"),
    (RATINGS + b"1," + b"9" * 5000 + b",4.0,5\n",
     "line 5: column 'movieId': '" + "9" * 40 + "... (5,000 characters)' does not fit"),
    (RATINGS + b"1,\xd9\xa3,4.0,5\n", "ratings.csv: line 5: column 'movieId': '\u0663' is not"),
    (RATINGS + b"1,NA,4.0,5\n", "ratings.csv: line 5: column 'movieId': 'NA' is not an"),
    (b"userId,movieId,rating," + b"x" * (65 << 10) + b"\n1,2,3,4\n",
     "ratings.csv: line 1: header longer than 64 KiB"),
])
def test_hostile_ratings_csv(tmp_path: Path, content: bytes, expected: str) -> None:
    (tmp_path / "ratings.csv").write_bytes(content)
    with pytest.raises(VaecfError) as err:
        _read("movielens", tmp_path, "ratings.csv")
    assert expected in str(err.value)
    assert len(str(err.value)) < 400


def test_line_longer_than_a_parse_block_is_named(tmp_path: Path) -> None:
    # 33 MiB: pyarrow cannot parse a line longer than two of its 16 MiB blocks (the hostile
    # case was a 200 MB line; the error was "straddling object ..." with no line number).
    (tmp_path / "ratings.csv").write_bytes(RATINGS + b"1,2,4.0," + b"7" * (33 << 20) + b"\n")
    with pytest.raises(VaecfError) as err:
        _read("movielens", tmp_path, "ratings.csv")
    assert str(err.value).endswith("ratings.csv: line 5: longer than 16 MiB (missing line "
                                   "breaks?)")


NETFLIX_MV1 = b"1:\n10,3,2005-09-06\n11,5,2005-09-07\n"
NETFLIX_MV2 = b"2:\n10,4,2005-09-06\n"


def test_netflix_per_movie_files_in_nested_tarball(tmp_path: Path) -> None:
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w") as archive:
        for name, data in (("training_set/mv_0000002.txt", NETFLIX_MV2),
                           ("training_set/mv_0000001.txt", NETFLIX_MV1)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    _tar(tmp_path / "nf_prize_dataset.tar.gz", {"download/training_set.tar": inner.getvalue(),
                                                "download/probe.txt": b"1:\n10\n"})
    raw = _read("netflix", tmp_path, "nf_prize_dataset.tar.gz")
    assert raw.user_id.tolist() == [10, 11, 10]
    assert raw.item_id.tolist() == [1, 1, 2]
    assert raw.value.tolist() == [3.0, 5.0, 4.0]


def test_netflix_combined_file_assigns_rows_to_their_movie(tmp_path: Path) -> None:
    text = b"17:\n5,1,2005-01-01\n6,2,2005-01-01\n3:\n7,3,2005-01-01\n8:\n9,4,2005-01-01\n" \
           b"9,5,2005-01-02\n1,5,2005-01-03\n"
    (tmp_path / "combined_data_1.txt").write_bytes(text)
    raw = _read("netflix", tmp_path, "combined_data_1.txt")
    assert raw.user_id.tolist() == [5, 6, 7, 9, 9, 1]
    assert raw.item_id.tolist() == [17, 17, 3, 8, 8, 8]
    assert raw.value.tolist() == [1, 2, 3, 4, 5, 5]


@pytest.mark.parametrize(("content", "expected"), [
    (b"5,1,2005-01-01\n", "combined_data_1.txt: line 1: expected a 'MovieID:' line"),
    (b"1:\n5,6,2005-01-01\n", "combined_data_1.txt: line 2: column 'rating': '6' is not in 1..5"),
    (b"1:\n5,3,2005-01-01\n\n6,3,2005-01-01\n", "combined_data_1.txt: line 3: expected 3"),
    (b"1:\nx,3,2005-01-01\n", "combined_data_1.txt: line 2: column 'customer_id': 'x' is not"),
])
def test_netflix_bad_input(tmp_path: Path, content: bytes, expected: str) -> None:
    (tmp_path / "combined_data_1.txt").write_bytes(content)
    with pytest.raises(VaecfError) as err:
        _read("netflix", tmp_path, "combined_data_1.txt")
    assert expected in str(err.value)


def test_lastfm_tsv_in_tarball(tmp_path: Path) -> None:
    rows = (b"u1\tmbid-a\tArtist \"A\"\t12\nu1\t\tno mbid\t3\nu2\tmbid-b\tB\t0\n"
            b"u2\tmbid-a\tA\t7\n")
    _tar(tmp_path / "lastfm-dataset-360K.tar.gz",
         {"lastfm-dataset-360K/usersha1-artmbid-artname-plays.tsv": rows,
          "lastfm-dataset-360K/usersha1-profile.tsv": b"u1\tf\t22\tPeru\tFeb 1, 2007\n"})
    raw = _read("lastfm", tmp_path, "lastfm-dataset-360K.tar.gz")
    assert raw.user_id.tolist() == ["u1", "u2", "u2"]
    assert raw.item_id.tolist() == ["mbid-a", "mbid-b", "mbid-a"]
    assert raw.value.tolist() == [12, 0, 7]
    assert raw.kind == "plays"
    assert raw.counts == {"rows_without_artist_mbid": 1}


def test_lastfm_negative_plays(tmp_path: Path) -> None:
    (tmp_path / "usersha1-artmbid-artname-plays.tsv").write_bytes(b"u1\tm\tA\t1\nu1\tn\tB\t-4\n")
    with pytest.raises(VaecfError, match="line 2: column 'plays': '-4' is not a play count"):
        _read("lastfm", tmp_path, "usersha1-artmbid-artname-plays.tsv")


@pytest.mark.parametrize("present", ["pinterest-20.test.rating", "pinterest-20.train.rating"])
def test_pinterest_needs_both_files(tmp_path: Path, present: str) -> None:
    (tmp_path / present).write_bytes(b"0\t9\t1\n")
    missing = ({"pinterest-20.test.rating", "pinterest-20.train.rating"} - {present}).pop()
    with pytest.raises(VaecfError, match=f"{missing} is missing .found {present}."):
        _read("pinterest", tmp_path, present)


def test_pinterest_train_and_test_files(tmp_path: Path) -> None:
    (tmp_path / "pinterest-20.train.rating").write_bytes(b"0\t5\t1\t0\n0\t6\t1\t0\n1\t5\t1\t0\n")
    (tmp_path / "pinterest-20.test.rating").write_bytes(b"0\t9\t1\n1\t3\t1\n")
    raw = _read("pinterest", tmp_path, "pinterest-20.train.rating", "pinterest-20.test.rating")
    assert raw.user_id.tolist() == [0, 1, 0, 0, 1]  # sorted by label: test file first
    assert raw.item_id.tolist() == [9, 3, 5, 6, 5]
    assert raw.kind == "implicit"
    assert np.all(raw.value == 1)


@pytest.mark.parametrize(("name", "content", "expected"), [
    ("usersha1-artmbid-artname-plays.tsv", b"u1\tm\tA\t1\nu\xff2\tm\tA\t1\n",
     "usersha1-artmbid-artname-plays.tsv: line 2: bytes are not UTF-8"),
    ("usersha1-artmbid-artname-plays.tsv", b"u1\tm\tA\t1\nu2\tm\tA\n",
     "line 2: expected 4 fields (user_sha1, artist_mbid, artist_name, plays), got 3"),
    ("pinterest-20.train.rating", b"", "pinterest-20.train.rating: file is empty"),
    ("pinterest-20.train.rating", b"0\t1\t1\n0\tx\t1\n",
     "pinterest-20.train.rating: line 2: column 'item': 'x' is not an integer"),
])
def test_other_readers_bad_input(tmp_path: Path, name: str, content: bytes,
                                 expected: str) -> None:
    (tmp_path / name).write_bytes(content)
    names = [name]
    if name.startswith("pinterest"):
        names.append("pinterest-20.test.rating")
        (tmp_path / names[1]).write_bytes(b"0\t9\t1\n")
    reader = "lastfm" if name.startswith("usersha1") else "pinterest"
    with pytest.raises(VaecfError) as err:
        _read(reader, tmp_path, *names)
    assert expected in str(err.value)
