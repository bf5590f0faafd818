"""Every MovieLens layout through ``vaecf download`` and ``vaecf preprocess``, from a zip, a
folder or a plain file the test writes; the counts are checked against pandas."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import stage_checks

from vaecf.io import read_manifest

SEPARATORS = {"ratings.dat": "::", "u.data": "\t", "ratings.csv": ","}


def _ratings_text(layout: str, half_stars: bool, seed: int) -> str:
    """About 2,000 ratings of 150 users on 60 items with skewed popularity, sparse ids and
    repeated pairs, so that every filter step removes something."""
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, 61) ** 0.8
    rows = []
    for user in range(150):
        k = int(rng.integers(1, 25))
        items = rng.choice(60, size=k, replace=False, p=popularity / popularity.sum())
        rows += [(user * 3 + 1, item * 7 + 2) for item in items]
    rows += [rows[int(j)] for j in rng.integers(0, len(rows), 40)]  # rated twice
    stars = rng.integers(1, 11 if half_stars else 6, len(rows))  # half stars: 0.5..5.0
    ratings = [f"{s / 2:g}" if half_stars else str(s) for s in stars]
    sep = SEPARATORS[layout]
    lines = [f"{u}{sep}{i}{sep}{r}{sep}{978300760 + n}\n"
             for n, ((u, i), r) in enumerate(zip(rows, ratings, strict=True))]
    header = "userId,movieId,rating,timestamp\n" if layout == "ratings.csv" else ""
    return header + "".join(lines)


def _pandas_reference(text: str, layout: str) -> tuple[dict[str, object], list[tuple[int, int]]]:
    """The preprocess counts and pairs, computed independently with pandas."""
    frame = pd.read_csv(io.StringIO(text), sep=SEPARATORS[layout], engine="python",
                        header=0 if layout == "ratings.csv" else None,
                        names=["user", "item", "rating", "timestamp"])

    def step(part: pd.DataFrame) -> dict[str, int]:
        return {"rows": len(part), "users": part["user"].nunique(),
                "items": part["item"].nunique()}

    positive = frame[frame["rating"] >= 4]
    dedup = positive.drop_duplicates(["user", "item"])
    users_per_item = dedup.groupby("item")["user"].nunique()
    kept_items = dedup[dedup["item"].map(users_per_item) >= 5]
    items_per_user = kept_items.groupby("user")["item"].nunique()
    output = kept_items[kept_items["user"].map(items_per_user) >= 5]
    counts = {"raw": step(frame), "implicit": step(positive), "dedup": step(dedup),
              "duplicates": len(positive) - len(dedup), "item_filter": step(kept_items),
              "user_filter": step(output), "output": step(output)}
    return counts, sorted(zip(output["user"], output["item"], strict=True))


CASES = [  # dataset, how the source is given, path of the ratings file, GroupLens release
    ("ml-1m", "zip", "ml-1m/ratings.dat", "ml-1m"),
    ("ml-10m", "zip", "ml-10M100K/ratings.dat", "ml-10m"),
    ("ml-100k", "zip", "ml-100k/u.data", "ml-100k"),
    ("ml-1m", "folder", "ml-1m/ratings.dat", "ml-1m"),
    ("ml-100k", "folder", "ml-100k/u.data", "ml-100k"),
    ("ml-latest-small", "folder", "ml-latest-small/ratings.csv", "ml-latest-small"),
    ("movielens", "file", "ratings.dat", None),
    ("movielens", "file", "u.data", None),
]


@pytest.mark.parametrize(("dataset", "form", "member", "release"), CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_layout_counts_equal_pandas(cli, tmp_path: Path, dataset: str, form: str,  # type: ignore[no-untyped-def]
                                    member: str, release: str | None) -> None:
    layout = Path(member).name
    text = _ratings_text(layout, half_stars="10M" in member or layout == "ratings.csv",
                         seed=len(member))
    source = tmp_path / "source"
    (source / member).parent.mkdir(parents=True)
    if form == "zip":  # not <dataset>.zip: that name is checked against GroupLens' MD5
        source = source / f"{dataset}-sample.zip"
        with zipfile.ZipFile(source, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(member, text)
            archive.writestr(str(Path(member).with_name("movies.dat")), "1::Toy Story::x\n")
    else:
        (source / member).write_text(text)
        source = source / member if form == "file" else source
    code, _, err = cli("download", "--dataset", dataset, "--source", source,
                       "--output", tmp_path / "raw")
    assert code == 0, err
    code, _, err = cli("preprocess", "--input", tmp_path / "raw", "--output", tmp_path / "out")
    assert code == 0, err

    counts, pairs = _pandas_reference(text, layout)
    manifest = read_manifest(tmp_path / "out", "preprocess")
    assert manifest["counts"] == counts
    assert counts["output"]["rows"] > 100 and counts["user_filter"] != counts["dedup"]
    frame = pq.read_table(tmp_path / "out" / "interactions.parquet").to_pandas()
    assert list(zip(frame["user_id"], frame["item_id"], strict=True)) == pairs
    for stage, directory in (("download", "raw"), ("preprocess", "out")):
        recorded = read_manifest(tmp_path / directory, stage)
        assert (recorded["dataset"], recorded["layout"], recorded["release"]) == (
            dataset, layout, release), stage


@pytest.mark.parametrize(("member", "content", "expected"), [
    ("ml-25m/ratings.csv", b"", "ratings.csv: file is empty"),
    ("ml-25m/ratings.csv", b"userId,movieId,timestamp\n1,2,3\n",
     "ratings.csv: line 1: missing column 'rating'"),
    ("ml-25m/ratings.csv", b"userId,movieId,rating,rating\n1,2,3,4\n",
     "ratings.csv: line 1: column 'rating' appears 2 times"),
    ("ml-25m/ratings.csv", b"userId,movieId,rating," + b"x" * (64 << 10) + b"\n",
     "ratings.csv: line 1: header longer than 64 KiB"),
    ("ml-1m/ratings.dat", b"1,2,3,4\n", "ratings.dat: line 1: expected 4 fields"),
    ("ml-25m/movies.csv", b"movieId,title\n", "no ratings.csv, ratings.dat or u.data among"),
])
def test_no_readable_ratings_fails_at_download(cli, tmp_path: Path, member: str,  # type: ignore[no-untyped-def]
                                               content: bytes, expected: str) -> None:
    source = tmp_path / "sample.zip"
    with zipfile.ZipFile(source, "w") as archive:
        archive.writestr(member, content)
    result = cli("download", "--dataset", "movielens", "--source", source,
                 "--output", tmp_path / "raw")
    stage_checks.assert_failed("download", result, tmp_path / "raw", expected)
