"""The synthetic generator: deterministic, MovieLens-shaped, with popularity skew."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from vaecf.data.synthetic import generate_ratings, write_ratings_csv


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
