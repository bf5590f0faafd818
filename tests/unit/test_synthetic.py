"""The synthetic generator: deterministic, MovieLens-shaped, with popularity skew, streamed."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd

from vaecf.data.datasets import get_dataset
from vaecf.data.download import SyntheticSize, download_dataset
from vaecf.data.synthetic import generate_ratings, iter_ratings, write_ratings_csv


def test_deterministic_and_shaped(tmp_path: Path) -> None:
    first = generate_ratings(500, 400, seed=5, mean_items=30.0)
    assert first.equals(generate_ratings(500, 400, seed=5, mean_items=30.0))
    assert not first.equals(generate_ratings(500, 400, seed=6, mean_items=30.0))
    assert list(first.columns) == ["userId", "movieId", "rating", "timestamp"]
    assert first["userId"].nunique() == 500
    assert first.groupby("userId").size().min() >= 5
    assert not first.duplicated(["userId", "movieId"]).any()
    assert set(np.unique(first["rating"])) <= {h / 2 for h in range(1, 11)}
    assert 0.4 < (first["rating"] >= 4).mean() < 0.6
    assert first["movieId"].max() > 400  # sparse ids, like MovieLens


def test_popularity_is_skewed() -> None:
    counts = generate_ratings(2000, 1000, seed=1).groupby("movieId").size()
    counts = counts.sort_values(ascending=False).to_numpy()
    top_decile = counts[: len(counts) // 10].sum() / counts.sum()
    assert top_decile > 0.2  # a uniform catalogue would give 0.1


def test_csv_round_trip(tmp_path: Path) -> None:
    frame = generate_ratings(50, 60, seed=2, mean_items=10.0)
    path = tmp_path / "ratings.csv"
    write_ratings_csv(frame, path)
    assert path.read_text().splitlines()[0] == "userId,movieId,rating,timestamp"
    back = pd.read_csv(path)
    pd.testing.assert_frame_equal(back, frame, check_dtype=False)


def test_a_large_catalogue_ranks_candidates_and_reaches_its_tail() -> None:
    """Above 32,768 items each user ranks candidates (half by popularity, half uniform):
    still no repeated (user, item), ML-20M's items per user, popularity skew, and a tail
    that ranking every item by popularity never reached (about 2,500 of 200,000 items from
    1,000 users before)."""
    frame = generate_ratings(1000, 200_000, seed=3)
    assert frame.equals(generate_ratings(1000, 200_000, seed=3))
    assert not frame.duplicated(["userId", "movieId"]).any()
    sizes = frame.groupby("userId").size()
    assert sizes.min() >= 5 and 100 < sizes.mean() < 200  # log-normal around 146
    counts = frame.groupby("movieId").size().sort_values(ascending=False).to_numpy()
    assert counts.size > 60_000  # the tail is reached
    # 0.5% of the catalogue holds 12% of the ratings (drawn uniformly: about 3%)
    assert counts[:1000].sum() / counts.sum() > 0.08


def _peak_traced_bytes(directory: Path, n_users: int) -> int:
    """Peak bytes that Python and numpy held while ``download --dataset synthetic`` generated
    ``n_users`` users x 1,000 items into ``directory``."""
    directory.mkdir()
    tracemalloc.start()
    try:
        download_dataset(get_dataset("synthetic"), None, directory,
                         synthetic=SyntheticSize(n_users, 1000, seed=4))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_download_streams_in_bounded_memory(tmp_path: Path) -> None:
    """Four times the users (174,000 vs 690,000 ratings), about the same peak memory: ratings
    are drawn and written a block of users at a time, so the peak is one block's (33 and 39
    MiB, blocks differ in size). Building the whole table first peaked at 34 and 90 MiB."""
    small = _peak_traced_bytes(tmp_path / "small", 1300)
    large = _peak_traced_bytes(tmp_path / "large", 5200)
    assert large < 1.5 * small, (small, large)
    rows = sum(1 for _ in (tmp_path / "large" / "ratings.csv").open()) - 1
    assert rows > 3.9 * (sum(1 for _ in (tmp_path / "small" / "ratings.csv").open()) - 1)


def test_blocks_join_into_the_table_and_rerun_identically(tmp_path: Path) -> None:
    """The streamed file is the in-memory table written at once, byte for byte, and a rerun
    writes the same bytes; blocks cover users in order, at most 1,024 each."""
    blocks = list(iter_ratings(2100, 300, seed=7, mean_items=20.0))
    assert [int(b["userId"].nunique()) for b in blocks] == [1024, 1024, 52]
    assert all(b["userId"].min() == 1 + 1024 * k for k, b in enumerate(blocks))
    write_ratings_csv(iter_ratings(2100, 300, seed=7, mean_items=20.0), tmp_path / "a.csv")
    write_ratings_csv(iter_ratings(2100, 300, seed=7, mean_items=20.0), tmp_path / "b.csv")
    write_ratings_csv(pd.concat(blocks, ignore_index=True), tmp_path / "c.csv")
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "c.csv").read_bytes()
