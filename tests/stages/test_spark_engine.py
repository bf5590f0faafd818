"""``--engine spark`` writes what ``--engine pandas`` writes: preprocess side by side, the split
against its rule (users by key, items of training users, held-out items by pair key).

One local SparkSession (the ``spark`` fixture) runs every case; the inputs are small."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import zipfile
from functools import partial
from pathlib import Path

import boto3
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
import stage_checks
from test_preprocess_stage import BAD_CSV, BAD_FILES, HEADER, download, download_files
from test_split_stage import interactions

from vaecf.data.split import SplitConfig, heldout_counts
from vaecf.data.split_keys import id_text, pair_keys, text_keys
from vaecf.data.splits import PART_FILES, SPLITS, Split, load_split, matrix_names
from vaecf.io import read_manifest

# a JVM on 2 cores: the session's start (15 s at a load of 15) is the first test's setup, and
# one query plan can take 30 s there
pytestmark = [pytest.mark.usefixtures("spark"), pytest.mark.slow]


def _ratings(seed: int = 0) -> pd.DataFrame:
    """90 users x 50 items, popularity skewed, half-star ratings, 10% of rows repeated: the
    filters cut users and items at and around 5, and k-core needs 3 rounds."""
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, 51)
    rows = [(user, item, rng.choice(np.arange(1, 11)) / 2)
            for user in rng.choice(np.arange(1, 10_000), 90, replace=False)
            for item in rng.choice(np.arange(1, 51) * 3, rng.integers(4, 30), replace=False,
                                   p=popularity / popularity.sum())]
    frame = pd.DataFrame(rows, columns=["userId", "movieId", "rating"])
    frame = pd.concat([frame, frame.sample(frac=0.1, random_state=seed)])
    return frame.sample(frac=1.0, random_state=seed + 1).assign(timestamp=1_000)


def _csv(frame: pd.DataFrame) -> bytes:
    return HEADER + b"".join(b"%d,%d,%s,%d\n" % (u, i, repr(float(r)).encode(), t)
                             for u, i, r, t in frame.itertuples(index=False))


def _zip(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(name, data)
    return buffer.getvalue()


def _both(cli, raw: Path | str, out: Path, *flags: object,  # type: ignore[no-untyped-def]
          ids: str = "int64") -> list[dict]:
    """Run ``vaecf preprocess`` with each engine; their interactions must be equal."""
    manifests = []
    for engine in ("pandas", "spark"):
        code, _, err = cli("preprocess", "--input", raw, "--output", out / engine,
                           "--engine", engine, *flags)
        assert code == 0, err
        manifests.append(read_manifest(out / engine, "preprocess"))
    tables = [pq.read_table(out / e / "interactions.parquet") for e in ("pandas", "spark")]
    assert tables[0].schema.types == [ids, ids]
    assert tables[0].num_rows > 0 and tables[0].equals(tables[1])
    assert [m["engine"] for m in manifests] == ["pandas", "spark"]
    assert manifests[0]["counts"] == manifests[1]["counts"]
    return manifests


@pytest.mark.parametrize("flags", [(), ("--protocol", "paper"), ("--k-core",)],
                         ids=["mission", "paper", "k-core"])
def test_preprocess_engines_write_the_same_interactions(cli, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                        flags: tuple[str, ...]) -> None:
    raw = download(cli, tmp_path, "ml-latest-small.zip",
                   _zip("ml-latest-small/ratings.csv", _csv(_ratings())), "ml-latest-small")
    counts = _both(cli, raw, tmp_path, *flags)[0]["counts"]
    assert counts["duplicates"] > 0
    assert counts["user_filter"]["users"] < counts["dedup"]["users"]
    if flags == ("--k-core",):
        assert counts["k_core"]["rounds"] >= 2
    elif not flags:
        assert counts["item_filter"]["items"] < counts["dedup"]["items"]


@pytest.mark.parametrize(("name", "dataset", "separator"),
                         [("ratings.dat", "ml-1m", b"::"), ("u.data", "ml-100k", b"\t")])
def test_preprocess_engines_read_the_fixed_layouts(cli, tmp_path: Path, name: str,  # type: ignore[no-untyped-def]
                                                   dataset: str, separator: bytes) -> None:
    lines = [separator.join(b"%d" % v if isinstance(v, int) else b"%g" % v for v in row)
             for row in _ratings(1).itertuples(index=False)]
    folder = {"ml-1m": "ml-1m", "ml-100k": "ml-100k"}[dataset]
    data = _zip(f"{folder}/{name}", b"\n".join(lines) + b"\n")
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / f"{dataset}.zip").write_bytes(data)
    code, _, err = cli("download", "--dataset", "movielens", "--source",
                       tmp_path / "source" / f"{dataset}.zip", "--output", tmp_path / "raw")
    assert code == 0, err
    assert _both(cli, tmp_path / "raw", tmp_path)[1]["layout"] == name


BAD = [*BAD_CSV,  # the pandas engine's words, from Spark's reader, and one more case:
       ("rating Spark would parse", HEADER + b"1,2,4.0,5\n1,3,4d,5\n",
        "ratings.csv: line 3: column 'rating': '4d' is not a number")]


@pytest.mark.parametrize("case", BAD, ids=[case[0] for case in BAD])
def test_spark_names_the_bad_line_as_pandas_does(cli, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                 case: tuple[bytes | str, ...]) -> None:
    _, content, *expected = case
    assert isinstance(content, bytes)
    raw = download(cli, tmp_path, "ml-25m.zip", _zip("ml-25m/ratings.csv", content), "movielens")
    result = cli("preprocess", "--input", raw, "--output", tmp_path / "out", "--engine", "spark")
    stage_checks.assert_failed("preprocess", result, tmp_path / "out", *map(str, expected))


def test_spark_names_the_bad_line_of_every_layout_as_pandas_does(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The pandas engine's cases (test_preprocess_stage.py's BAD_FILES), one run each."""
    for number, (case, dataset, files, flags, expected) in enumerate(BAD_FILES):
        raw = download_files(cli, tmp_path / str(number), dataset, files, *flags)
        result = cli("preprocess", "--input", raw, "--output", tmp_path / "out",
                     "--engine", "spark")
        assert result[0] == 1 and expected in result[2], (case, result[2])
        stage_checks.assert_failed("preprocess", result, tmp_path / "out", expected)


def _netflix(seed: int) -> bytes:
    """A combined file: 30 movies of 0..20 ratings by 40 customers, CRLF line ends, a
    byte-order mark, movies in no order and a movie with no rating (two movie lines)."""
    rng = np.random.default_rng(seed)
    blocks = [b"%d:\r\n" % movie + b"".join(
        b"%d,%d,2005-09-%02d\r\n" % (customer * 7, rng.integers(1, 6), day)
        for day, customer in enumerate(rng.choice(np.arange(1, 41), rng.integers(0, 21),
                                                  replace=False), start=1))
        for movie in rng.permutation(np.arange(1, 31) + 100 * seed)]
    return b"\xef\xbb\xbf" + b"".join(blocks)


def test_engines_read_netflix_the_same(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # The download directory's name is a glob pattern to Hadoop; Spark reads it as it is.
    raw = download_files(cli, tmp_path / "a[0]*{b,c}?", "netflix",
                         {"combined_data_1.txt": _netflix(1), "combined_data_2.txt": _netflix(2)})
    manifests = _both(cli, raw, tmp_path, "--min-rating", "3")
    assert manifests[1]["files_read"] == ["combined_data_1.txt", "combined_data_2.txt"]
    assert manifests[1]["counts"]["output"]["items"] > 30  # movies of both files


def test_engines_read_lastfm_the_same(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Text ids (users "007" and "7" are two), names with quotes, commas, tabs' neighbours and
    bytes that are not UTF-8 (never parsed), rows without an artist id (left out, counted)."""
    rng = np.random.default_rng(4)
    users = [b"007", b"7", *(b"%040x" % int(u) for u in rng.integers(1, 2**60, 40))]
    names = [b'"Quoted" Band', b"AC,DC", b"caf\xc3\xa9", b"\xff\xfe odd", b"'", b""]
    rows = [b"\t".join([user, b"" if artist % 11 == 0 else b"mbid-%d" % artist,
                        names[artist % len(names)], b"%d" % rng.integers(0, 40)])
            for user in users for artist in rng.choice(60, rng.integers(5, 25), replace=False)]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = b"\n".join(rows) + b"\n"
        info = tarfile.TarInfo("lastfm-dataset-360K/usersha1-artmbid-artname-plays.tsv")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    raw = download_files(cli, tmp_path, "lastfm", {"lastfm-dataset-360K.tar.gz":
                                                   buffer.getvalue()})
    counts = _both(cli, raw, tmp_path, "--min-plays", "2", ids="string")[1]["counts"]
    assert counts["rows_without_artist_mbid"] > 0
    users = pq.read_table(tmp_path / "spark" / "interactions.parquet")["user_id"].to_pylist()
    assert {"007", "7"} <= set(users)


def test_engines_read_pinterest_the_same(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(6)
    train = [(u, i) for u in range(50) for i in rng.choice(80, rng.integers(3, 20), replace=False)]
    raw = download_files(cli, tmp_path, "pinterest", {
        "pinterest-20.train.rating": b"".join(b"%d\t%d\t1\t%d\n" % (u, i, 9 * u)
                                              for u, i in train),
        "pinterest-20.test.rating": b"".join(b"%d\t%d\t1\n" % (u, 80 + u % 3)
                                             for u in range(50))})
    assert _both(cli, raw, tmp_path, "--protocol", "paper")[1]["layout"] == (
        "pinterest-20.{train,test}.rating")


def _plays(seed: int, first: int) -> dict[str, list[object]]:
    rng = np.random.default_rng(seed)
    rows = [(u, f"i{i:02d}", float(rng.integers(0, 4))) for u in range(first, first + 30)
            for i in rng.choice(40, rng.integers(3, 15), replace=False)]
    return {"user": [u for u, _, _ in rows], "item": [i for _, i, _ in rows],
            "n": [n for _, _, n in rows]}


def _table_folder(root: Path) -> Path:
    """Parquet files (several row groups each) whose names are glob patterns to Hadoop,
    in a folder and a subfolder, with Spark's _SUCCESS and .crc files: integer user ids in
    one file ("7"), text ids in another ("007" is another user, "7" the same)."""
    logs = root / "logs"
    (logs / "2024").mkdir(parents=True)
    pq.write_table(pa.table(_plays(1, 0)), logs / "part-[0]*.parquet", row_group_size=40)
    text = _plays(2, 5)
    text["user"] = [f"{u:03d}" if u % 2 else str(u) for u in text["user"]]
    pq.write_table(pa.table(text), logs / "2024" / "{a,b}?.parquet", row_group_size=33)
    (logs / "_SUCCESS").write_bytes(b"")
    (logs / ".part-[0]*.parquet.crc").write_bytes(b"crc")
    return logs


PLAYS = ("--user-column", "user", "--item-column", "item", "--value-column", "n",
         "--value-kind", "plays")


@pytest.mark.parametrize("where", ["parquet-folder", "csv-file", "s3-prefix"])
def test_engines_read_a_table_the_same(cli, tmp_path: Path, where: str,  # type: ignore[no-untyped-def]
                                       request: pytest.FixtureRequest) -> None:
    source: Path | str = _table_folder(tmp_path)
    raw: Path | str = tmp_path / "raw"
    if where == "csv-file":
        frame = pa.table(_plays(3, 0)).to_pandas().astype({"n": int})
        source = tmp_path / "plays [x]*.csv"
        frame[["n", "item", "user"]].to_csv(source, index=False)
    elif where == "s3-prefix":
        bucket = request.getfixturevalue("s3_bucket")
        s3 = boto3.client("s3")
        for path in sorted(p for p in Path(source).rglob("*") if p.is_file()):
            s3.put_object(Bucket=bucket, Key=f"events/{path.relative_to(source).as_posix()}",
                          Body=path.read_bytes())
        source, raw = f"s3://{bucket}/events/", f"s3://{bucket}/raw"
    code, _, err = cli("download", "--dataset", "table", "--source", source, *PLAYS,
                       "--output", raw)
    assert code == 0, err
    manifests = _both(cli, raw, tmp_path, "--min-plays", "2", ids="string")
    assert manifests[1]["layout"] == ("csv" if where == "csv-file" else "parquet")
    if where != "csv-file":
        users = set(pq.read_table(tmp_path / "spark" / "interactions.parquet")["user_id"]
                    .to_pylist())
        assert {"7", "007", "8"} <= users


# ---- the split: the rule written out longhand, and Spark's files against it ----

def rule(frame: pd.DataFrame, config: SplitConfig) -> dict:
    """The split rule (``vaecf.data.split``'s docstring) in plain Python, slow and obvious."""
    user_ids = sorted(set(frame["user_id"]))
    keys = dict(zip(user_ids, text_keys(config.seed, user_ids), strict=True))
    n_val, n_test = heldout_counts(len(user_ids), config)
    ordered = sorted(user_ids, key=lambda u: (int(keys[u]), id_text(u)))
    split = {u: 1 if r < n_val else 2 if r < n_val + n_test else 0
             for r, u in enumerate(ordered)}
    frame = frame.assign(split=frame["user_id"].map(split))
    items = sorted(set(frame.loc[frame["split"] == 0, "item_id"]))
    item_keys = dict(zip(items, text_keys(config.seed, items), strict=True))
    kept = frame[frame["item_id"].isin(items)]
    users = sorted({(s, u) for u, s in zip(kept["user_id"], kept["split"], strict=True)})
    user_idx = {u: i for i, (_, u) in enumerate(users)}
    item_idx = {v: i for i, v in enumerate(items)}
    parts: dict[str, list[tuple[int, int]]] = {name: [] for name in matrix_names()}
    without_holdout = {"val": 0, "test": 0}
    for user, group in kept.groupby("user_id"):
        code = split[user]
        if code == 0:
            parts["train"] += [(user_idx[user], item_idx[i]) for i in group["item_id"]]
            continue
        name = SPLITS[code]
        own = list(group["item_id"])
        pairs = pair_keys(np.full(len(own), keys[user]), np.array([item_keys[i] for i in own]))
        order = [i for _, _, i in sorted(zip(pairs.tolist(), map(id_text, own), own,
                                             strict=True))]
        cut = int(np.floor(config.holdout_fraction * len(order)))
        parts[f"{name}_holdout"] += [(user_idx[user], item_idx[i]) for i in order[:cut]]
        parts[f"{name}_fold_in"] += [(user_idx[user], item_idx[i]) for i in order[cut:]]
        without_holdout[name] += cut == 0
    return {"users": [(user_idx[u], u, SPLITS[s]) for s, u in users], "items": items,
            "parts": {name: sorted(pairs) for name, pairs in parts.items()},
            "counts": {"pairs_outside_item_universe": len(frame) - len(kept),
                       "heldout_users_without_items": len(user_ids) - len(users),
                       "val_users_without_holdout": without_holdout["val"],
                       "test_users_without_holdout": without_holdout["test"]}}


def _pairs(text_ids: bool) -> pd.DataFrame:
    """300 users with 1..25 items among 120; the 6 users with the smallest keys (held out)
    own only items nobody else has, so they leave the item universe with all their items."""
    rng = np.random.default_rng(7)
    user_ids = rng.choice(np.arange(1, 100_000), 300, replace=False)
    rows = [(u, i) for u in user_ids
            for i in rng.choice(np.arange(1, 121) * 11, rng.integers(1, 26), replace=False)]
    frame = pd.DataFrame(rows, columns=["user_id", "item_id"])
    shown = [f"u{u}" if text_ids else u for u in user_ids]
    first = user_ids[np.argsort(text_keys(5, shown))[:6]]
    frame = frame[~frame["user_id"].isin(first)]
    lost = pd.DataFrame([(u, 5_000 + 10 * n + k) for n, u in enumerate(first) for k in range(3)],
                        columns=["user_id", "item_id"])
    frame = pd.concat([frame, lost])
    if text_ids:
        frame = frame.assign(user_id=[f"u{u}" for u in frame["user_id"]],
                             item_id=[f"i{i:x}" for i in frame["item_id"]])
    return frame.sample(frac=1.0, random_state=1)


@pytest.mark.parametrize(("text_ids", "flags", "config"), [
    (False, (), SplitConfig(seed=5)),
    (True, ("--protocol", "paper", "--heldout-users", 25, "--holdout-fraction", 0.5),
     SplitConfig(seed=5, heldout_users=25, holdout_fraction=0.5)),
], ids=["mission-integer-ids", "paper-text-ids"])
def test_spark_split_follows_the_rule(cli, tmp_path: Path, text_ids: bool,  # type: ignore[no-untyped-def]
                                      flags: tuple[object, ...], config: SplitConfig) -> None:
    frame = _pairs(text_ids)
    source = interactions(tmp_path / "in[1]*{a,b}?", frame)  # a name, never a glob pattern
    code, _, err = cli("split", "--input", source, "--output", tmp_path / "out", "--seed", 5,
                       "--engine", "spark", *flags)
    assert code == 0, err
    out, expected = tmp_path / "out", rule(frame, config)
    users = pq.read_table(out / "user_index.parquet").to_pandas()
    assert list(users.itertuples(index=False, name=None)) == expected["users"]
    items = pq.read_table(out / "item_index.parquet").to_pandas()
    assert list(items["item_id"]) == expected["items"]
    assert list(items["item_idx"]) == list(range(len(expected["items"])))
    manifest = read_manifest(out, "dataset")
    assert manifest["engine"] == "spark"
    counts = {k: manifest["counts"][k] for k in expected["counts"]}
    assert counts == expected["counts"]
    assert counts["heldout_users_without_items"] >= 6  # the users who lost every item
    assert counts["val_users_without_holdout"] + counts["test_users_without_holdout"] > 0
    for part, pairs in expected["parts"].items():
        table = pq.read_table(out / f"{part}.parquet")
        assert table.schema.types == ["int32", "int32"]
        assert list(zip(*table.to_pydict().values(), strict=True)) == pairs, part
        offset = manifest["user_offset"][part.split("_")[0]]
        rows = manifest["n_users"][part.split("_")[0]]
        matrix = sp.load_npz(out / f"{part}.npz")
        want = sp.csr_matrix((np.ones(len(pairs), np.float32),
                              ([u - offset for u, _ in pairs], [i for _, i in pairs])),
                             shape=(rows, len(expected["items"])))
        assert matrix.dtype == np.float32 and matrix.shape == want.shape
        assert (matrix != want).nnz == 0, part
    # ... and the pandas engine's files on the same input and seed are equal by content.
    code, _, err = cli("split", "--input", source, "--output", tmp_path / "pandas", "--seed", 5,
                       *flags)
    assert code == 0, err
    assert_same_split(out, tmp_path / "pandas")


def assert_same_split(spark: Path, pandas: Path) -> None:
    """Two engines' splits equal by content: every table, every matrix, the manifests' counts
    and layout (Parquet bytes may differ). A Spark split of parts (an ``s3://`` output's: no
    NPZ) is compared table by table, its parts read in order, and as ``load_split`` loads it."""
    manifests = read_manifest(spark, "dataset"), read_manifest(pandas, "dataset")
    assert [m["engine"] for m in manifests] == ["spark", "pandas"]
    keys = ["counts", "n_users", "n_items", "user_offset", "split_function", "parameters"]
    if PART_FILES in manifests[0]:
        assert not list(spark.glob("*.npz")) and not list(spark.glob("*.parquet"))
        for name in ["user_index", "item_index", *matrix_names()]:
            parts = manifests[0][PART_FILES][f"{name}.parquet"]
            table = pa.concat_tables(pq.read_table(spark / part["name"]) for part in parts)
            assert table.to_pydict() == pq.read_table(pandas / f"{name}.parquet").to_pydict(), name
        assert_same_loaded(load_split(spark), load_split(pandas))
    else:
        keys.append("train_row_groups")
        for name in ["user_index", "item_index", *matrix_names()]:
            assert (pq.read_table(spark / f"{name}.parquet").to_pydict()
                    == pq.read_table(pandas / f"{name}.parquet").to_pydict()), name
        for name in matrix_names():
            a, b = sp.load_npz(spark / f"{name}.npz"), sp.load_npz(pandas / f"{name}.npz")
            assert a.shape == b.shape and a.dtype == b.dtype and (a != b).nnz == 0, name
    for key in keys:
        assert manifests[0][key] == manifests[1][key], key


def assert_same_loaded(a: Split, b: Split) -> None:
    """Two loaded splits hold the same CSR matrices (canonical: the same arrays), raw ids
    and users."""
    assert (a.train_first, a.n_train_pairs, a.n_items) == (b.train_first, b.n_train_pairs,
                                                            b.n_items)
    for name in matrix_names():
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape and x.dtype == y.dtype == np.float32, name
        for array in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(x, array), getattr(y, array), err_msg=name)
    assert a.item_ids.tolist() == b.item_ids.tolist()
    assert a.user_index().to_pydict() == b.user_index().to_pydict()


assert_split_failed = partial(stage_checks.assert_failed, "split")


def test_a_heldout_user_kept_by_an_item_of_another_partition(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A task places only its own range of users: a held-out user whose items no training
    user of its partition has is kept if a training user of another partition has one
    (the driver checks such users against the universe), and dropped if none has."""
    ids = np.arange(1, 201)
    n_val, n_test = heldout_counts(len(ids), SplitConfig())
    order = np.argsort(text_keys(5, ids))  # no tie among 200 keys
    heldout, train = np.sort(ids[order[:n_val + n_test]]), ids[order[n_val + n_test:]]
    kept, lost, far = heldout[0], heldout[1], train.max()
    assert kept < 60 and lost < 60 and far > 140  # the first and the last of two partitions
    rows = [(u, i) for u in ids if u not in (kept, lost) for i in range(1 + u % 7, 8 + u % 7)]
    rows += [(kept, 1000), (kept, 1001), (far, 1000), (lost, 2000)]
    source = interactions(tmp_path / "in", pd.DataFrame(rows, columns=["user_id", "item_id"]))
    for engine in ("spark", "pandas"):
        code, _, err = cli("split", "--input", source, "--output", tmp_path / engine,
                           "--seed", 5, "--engine", engine)
        assert code == 0, err
    assert_same_split(tmp_path / "spark", tmp_path / "pandas")
    users = pq.read_table(tmp_path / "spark" / "user_index.parquet").column("user_id").to_pylist()
    assert kept in users and lost not in users
    counts = read_manifest(tmp_path / "spark", "dataset")["counts"]
    assert counts["heldout_users_without_items"] == 1
    assert counts["pairs_outside_item_universe"] == 2  # 1001 and 2000


def test_spark_split_refuses_too_few_users_as_pandas_does(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source = interactions(tmp_path / "in", _pairs(False), dataset="ml-20m")
    assert_split_failed(cli("split", "--input", source, "--output", tmp_path / "out",
                            "--protocol", "paper", "--engine", "spark"), tmp_path / "out",
                        "cannot hold out 10000 val + 10000 test users of 300")


@pytest.mark.slow
def test_the_cli_starts_its_own_session_on_the_master_it_is_given(tmp_path: Path) -> None:
    """``vaecf split --engine spark`` as a process: no session is active, so it starts one on
    the master that MASTER names (spark-submit's variable), and stops it."""
    source = interactions(tmp_path / "in", _pairs(False))
    env = {**os.environ, "MASTER": "local[1]"}
    env.pop("SPARK_CONF_DIR", None)
    done = subprocess.run([sys.executable, "-m", "vaecf.cli", "split", "--input", str(source),
                           "--output", str(tmp_path / "out"), "--engine", "spark"],
                          capture_output=True, text=True, env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stderr
    assert "master local[1]" in done.stdout
    assert "Using Spark's default log4j profile" not in done.stderr  # vaecf's quiet one
    assert read_manifest(tmp_path / "out", "dataset")["engine"] == "spark"


@pytest.mark.parametrize("column", ["user", "item"])
def test_spark_refuses_a_long_id_as_pandas_does(cli, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                column: str) -> None:
    """An id longer than serving takes (``MAX_ID_BYTES``), found in the per-id tables."""
    long = "é" * 129  # 258 bytes of UTF-8
    rows = {"user": ["u1", "u2", "u1"], "item": ["i1", "i1", "i2"]}
    rows[column][0] = long
    source = tmp_path / "source" / "a.csv"
    source.parent.mkdir()
    source.write_text("user,item\n" + "".join(
        f"{u},{i}\n" for u, i in zip(rows["user"], rows["item"], strict=True)))
    code, _, err = cli("download", "--dataset", "table", "--source", source.parent,
                       "--user-column", "user", "--item-column", "item", "--output",
                       tmp_path / "raw")
    assert code == 0, err
    for engine in ("pandas", "spark"):
        result = cli("preprocess", "--input", tmp_path / "raw", "--output", tmp_path / engine,
                     "--min-user-items", "1", "--min-item-users", "1", "--engine", engine)
        stage_checks.assert_failed("preprocess", result, tmp_path / engine,
                                   f"a.csv: {column}_id 'éééé", "is 258 bytes long")
