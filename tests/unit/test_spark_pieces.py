"""The Spark engine's pieces of text files: every line read once, whatever the split points
and block sizes; Netflix' ratings keep their movie across blocks. Plain Python (no Spark)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from vaecf.data.readers.archive import DataFile
from vaecf.data.readers.netflix import read_netflix_file
from vaecf.data.spark.pieces import LineTooLong, line_blocks, movie_blocks


def _lines(data: bytes, starts: list[int], header: bool, block: int) -> list[bytes]:
    ends = [*starts[1:], len(data)]
    found = []
    for start, end in zip(starts, ends, strict=True):
        with io.BytesIO(data) as handle:
            found += b"".join(line_blocks(handle, start, end, header, block)).splitlines(True)
    return found


@pytest.mark.parametrize("header", [False, True])
def test_every_line_is_read_once_whatever_the_splits(header: bool) -> None:
    rng = np.random.default_rng(3)
    lines = [b"%d,%s\n" % (n, b"x" * int(rng.integers(0, 30))) for n in range(300)]
    data = b"".join(lines)
    expected = lines[1:] if header else lines
    for _ in range(40):
        cuts = sorted({0, *rng.integers(1, len(data), int(rng.integers(1, 12))).tolist()})
        assert _lines(data, cuts, header, int(rng.integers(40, 120))) == expected
    # A cut right after a newline, at the last byte, and a last line without its newline.
    cut = data.index(b"\n") + 1
    assert _lines(data, [0, cut, len(data) - 1], header, 40) == expected
    assert _lines(data[:-1], [0, 50], header, 40)[-1] == lines[-1][:-1]


def test_a_byte_order_mark_starting_the_file_is_not_data() -> None:
    data = b"\xef\xbb\xbf1,a\n2,b\n"
    assert _lines(data, [0, 5], False, 4) == [b"1,a\n", b"2,b\n"]


def test_a_line_longer_than_a_block_is_refused() -> None:
    with pytest.raises(LineTooLong):
        _lines(b"1,a\n" + b"9" * 100 + b"\n", [0], False, 16)


def test_netflix_movies_across_blocks_are_the_pandas_readers(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    text = b"".join(b"%d:\r\n" % movie + b"".join(
        b"%d,%d,2005-01-01\r\n" % (rng.integers(1, 99), rng.integers(1, 6))
        for _ in range(int(rng.integers(0, 7)))) for movie in rng.permutation(40) + 1)
    path = tmp_path / "combined_data_1.txt"
    path.write_bytes(text)
    raw = read_netflix_file(DataFile(path.name, path))
    expected = list(zip(raw.user_id.tolist(), raw.item_id.tolist(), strict=True))
    for block in (20, 27, 40, 1 << 20):
        with open(path, "rb") as handle:
            found = [(int(line.split(b",")[0]), movie)
                     for movie, part in movie_blocks(line_blocks(handle, 0, len(text), False,
                                                                 block))
                     for line in part.splitlines()]
        assert found == expected, block


def test_a_task_places_a_user_whose_key_ties_a_bound_by_its_id_text() -> None:
    """Users are ordered by (key, id text): a user whose key equals a bound's is before it
    only if its id's text is (keys of 64 bits never tie in a test's data, so the tie is
    forged here)."""
    from vaecf.data.spark.split_tasks import Bounds, user_splits
    from vaecf.data.split_keys import text_keys

    ids = np.array([3, 12, 7])
    keys = text_keys(1, ids)
    tie = int(keys[1])
    low, high = (int(keys.min()) - 1, ""), (int(keys.max()) + 1, "")
    train, val, test = range(3)

    def before(key: int, text: str, bound: tuple[int, str]) -> bool:
        return key < bound[0] or (key == bound[0] and text < bound[1])

    for bounds, split in [(Bounds(test=low, train=(tie, "13")), test),  # "12" < "13"
                          (Bounds(test=low, train=(tie, "12")), train),  # itself: not before
                          (Bounds(test=(tie, "120"), train=high), val),  # a prefix first
                          (Bounds(test=(tie, "2"), train=high), val),  # text, not numbers
                          (Bounds(test=(tie, "1"), train=high), test)]:
        codes, found = user_splits(1, ids, bounds)
        assert found.tolist() == keys.tolist()
        assert codes[1] == split, bounds
        assert codes.tolist() == [val if before(int(k), str(i), bounds.test) else
                                  test if before(int(k), str(i), bounds.train) else train
                                  for k, i in zip(keys, ids, strict=True)]


@pytest.mark.parametrize("text", [False, True])
def test_rows_are_cut_into_ranges_of_whole_users_in_order(text: bool) -> None:
    """``ranged`` sends each user's rows, whole and in their order, to the range its id falls
    in (after the previous bound, up to its own: numbers, or text by code point), packed
    under that range's key; ``gathered`` reads them back."""
    import pyarrow as pa

    from vaecf.data.spark.pieces import RANGED, packed, ranged, unpacked

    rng = np.random.default_rng(0)
    users = rng.integers(0, 40, 500)
    ids = np.array([f"u{u}" for u in users], object) if text else users
    table = pa.table({"user_id": ids, "item_id": np.arange(500)})
    bounds = np.array(["u15", "u30", "u30"], object) if text else np.array([10, 25, 25])
    keys = [101, 202, 303, 404]
    batches = list(packed(table, pa.schema([("blob", pa.binary())])))
    found: dict[int, list[pa.Table]] = {}
    for row in ranged(batches, bounds, keys):
        assert row.schema == RANGED
        found.setdefault(row.column("key")[0].as_py(), []).append(unpacked([row]))
    assert sorted(found) == [101, 202, 404]  # between two equal bounds: no user
    for j, key in enumerate(keys):
        if key == 303:
            continue
        part = pa.concat_tables(found[key])
        inside = np.array([(j == 0 or i > bounds[j - 1]) and (j == 3 or i <= bounds[j])
                           for i in ids])
        assert part.column("user_id").to_pylist() == list(ids[inside])
        assert part.column("item_id").to_pylist() == np.flatnonzero(inside).tolist()


def test_a_task_refuses_rows_of_another_partition() -> None:
    """A row whose key is not the task's partition's would split its users: refused."""
    import pyarrow as pa

    from vaecf.data.spark.pieces import RANGED, gathered, packed

    table = pa.table({"user_id": [1, 1], "item_id": [2, 3]})
    rows = list(packed(table, RANGED, key=7))
    assert gathered(rows, [7, 8]).equals(table)  # outside Spark: partition 0
    with pytest.raises(RuntimeError, match="another range of users"):
        gathered(rows, [8, 7])


@pytest.mark.parametrize("text", [False, True])
def test_ids_are_factorized_as_pandas_sorts_them(text: bool) -> None:
    """``factorized`` is ``pd.factorize(sort=True)``: text by code point (Arrow's byte order
    of UTF-8), over chunks, whatever the order the values come in."""
    import pandas as pd
    import pyarrow as pa

    from vaecf.data.spark.pieces import factorized

    values = (["z", "é", "a", "\U0001f600", "\ufffd", "é", "Z", "a"] if text
              else [7, -3, 12, 7, 0, 2**40, -3, 5])
    column = pa.chunked_array([pa.array(values[:3]), pa.array(values[3:])])
    codes, distinct = factorized(column)
    expected_codes, expected = pd.factorize(np.array(values, object if text else np.int64),
                                            sort=True)
    assert codes.tolist() == expected_codes.tolist()
    assert list(distinct) == list(expected)
