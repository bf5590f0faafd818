"""Synthetic ratings with power-law popularity and planted low-rank taste.

Used by the tests, ``make demo`` and the benchmarks. Each user has a latent taste vector and
each item a latent profile; a user's items are the top of ``taste . profile + popularity +
Gumbel noise``, so a model that learns the low-rank structure beats popularity by a wide
margin, while popularity alone still explains part of the data (as in real catalogues).
The output has MovieLens' ``ratings.csv`` columns so it exercises the same reader. It is drawn
and written a block of users at a time, so any size fits in a few hundred MB of memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from vaecf.log import Progress

RATINGS_COLUMNS = ("userId", "movieId", "rating", "timestamp")
_SCHEMA = pa.schema([("userId", pa.int64()), ("movieId", pa.int64()), ("rating", pa.string()),
                     ("timestamp", pa.int64())])
_CHUNK_USERS = 1024
# Cells drawn at once: users x items, or above ``_DENSE_ITEMS`` users x candidates x rank (the
# candidates' gathered profiles).
_CHUNK_CELLS = 1 << 25
# Up to this many items (a chunk of ``_CHUNK_USERS`` users) every user's affinity to every
# item is drawn. Above, each user ranks ``_CANDIDATES`` x their item count candidates only: the
# cost grows with the ratings, not users x items, and the catalogue's tail is covered.
_DENSE_ITEMS = _CHUNK_CELLS // _CHUNK_USERS
_CANDIDATES = 4
# How strongly taste beats popularity: at 3, EASE roughly doubles popularity's NDCG@100.
_TASTE_SCALE = 3.0


def generate_ratings(n_users: int, n_items: int, seed: int, mean_items: float = 146.0,
                     rank: int = 16, liked_fraction: float = 0.5) -> pd.DataFrame:
    """Draw a MovieLens-shaped ratings table in memory: ``iter_ratings``' blocks, joined.

    Returns:
      A frame with columns userId, movieId (int64), rating (float64, half stars in
      0.5..5.0), timestamp (int64), sorted by (userId, movieId).
    """
    return pd.concat(iter_ratings(n_users, n_items, seed, mean_items, rank, liked_fraction),
                     ignore_index=True)


def iter_ratings(n_users: int, n_items: int, seed: int, mean_items: float = 146.0,
                 rank: int = 16, liked_fraction: float = 0.5) -> Iterator[pd.DataFrame]:
    """Draw a MovieLens-shaped ratings table block by block, in bounded memory.

    Each block holds at most ``_CHUNK_USERS`` users (fewer above ``_DENSE_ITEMS`` items) and
    is drawn from ``seed`` alone, so memory grows with ``n_users`` only by each user's taste
    and item count (under 200 bytes while they are drawn), and the same arguments give the
    same blocks.

    Args:
      n_users: users to draw (``userId`` 1..n_users).
      n_items: catalogue size; ``movieId`` values are sparse and unordered, like MovieLens'.
      seed: the only source of randomness.
      mean_items: mean ratings per user (log-normal, at least 5): ML-20M has about 146.
      rank: dimension of the planted taste space.
      liked_fraction: share of a user's ratings that are >= 4 stars (the implicit positives);
        ML-20M has about half.

    Yields:
      Frames with columns userId, movieId (int64), rating (float64, half stars in 0.5..5.0),
      timestamp (int64), each sorted by (userId, movieId), users ascending across blocks.
    """
    rng = np.random.default_rng(seed)
    # Stars and timestamps come from a stream of their own, drawn block by block: which items
    # a user rates, and which of them are liked, do not depend on the block size.
    values = np.random.default_rng([seed, 1])
    popularity = np.log(1.0 / np.arange(1, n_items + 1) ** 1.0)  # Zipf, by popularity rank
    profiles = rng.standard_normal((n_items, rank)).astype(np.float32)
    tastes = rng.standard_normal((n_users, rank)).astype(np.float32)
    sizes = np.clip(rng.lognormal(np.log(mean_items) - 0.5, 1.0, n_users), 5, n_items // 2)
    sizes = sizes.astype(np.int64)
    movie_ids = rng.choice(np.arange(1, 5 * n_items + 1), size=n_items, replace=False)

    bar = Progress("synthetic ratings", n_users, "users")
    scale = _TASTE_SCALE / np.sqrt(rank)
    start = 0
    while start < n_users:
        if n_items <= _DENSE_ITEMS:
            stop = min(start + _CHUNK_USERS, n_users)
            pool = np.broadcast_to(np.arange(n_items), (stop - start, n_items))
            affinity = tastes[start:stop] @ profiles.T * scale + popularity
        else:
            stop, pool = _candidates(rng, sizes, start, n_items, rank)
            affinity = np.einsum("uk,uck->uc", tastes[start:stop], profiles[pool]) * scale
            affinity[:, 1:][pool[:, 1:] == pool[:, :-1]] = -np.inf  # a candidate drawn twice
        users, items, liked = _pick(rng, affinity, pool, sizes[start:stop], liked_fraction)
        del affinity, pool  # the consumer writes the block while this frame waits: free them
        yield _block(users + (start + 1), movie_ids[items], liked, values)
        bar.update(stop - start)
        start = stop
    bar.close()


def _pick(rng: np.random.Generator, affinity: np.ndarray, pool: np.ndarray, sizes: np.ndarray,
          liked_fraction: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each user's ``size`` best items by affinity plus Gumbel noise (a draw without
    replacement), best first, the first ``liked_fraction`` of them liked.

    Args:
      affinity: (users, C) float32 affinity of each user to each of ``pool``'s items.
      pool: (users, C) item of each cell.
      sizes: (users,) items per user.

    Returns:
      (n,) user (0-based, within the block), (n,) item and (n,) liked, users ascending.
    """
    affinity += rng.gumbel(size=affinity.shape).astype(np.float32)
    top = int(sizes.max())
    picked = np.argpartition(-affinity, top - 1, axis=1)[:, :top]
    best = np.take_along_axis(affinity, picked, 1)
    ranks = np.argsort(-best, axis=1, kind="stable")
    order = np.take_along_axis(pool, np.take_along_axis(picked, ranks, 1), 1)
    drawn = np.isfinite(np.take_along_axis(best, ranks, 1))  # never a repeated candidate
    users, items, liked = [], [], []
    for row, size in enumerate(sizes):
        chosen = order[row, :size][drawn[row, :size]]
        users.append(np.full(chosen.size, row, dtype=np.int64))
        items.append(chosen)
        liked.append(np.arange(chosen.size) < max(1, round(liked_fraction * chosen.size)))
    return np.concatenate(users), np.concatenate(items), np.concatenate(liked)


def _block(users: np.ndarray, movies: np.ndarray, liked: np.ndarray,
           values: np.random.Generator) -> pd.DataFrame:
    """One block of ratings, sorted by (userId, movieId): liked pairs get 4..5 stars, the
    others 0.5..3.5, and every rating a timestamp (both drawn from ``values``)."""
    stars = np.where(liked, values.integers(8, 11, liked.size),
                     values.integers(1, 8, liked.size)) / 2.0
    frame = pd.DataFrame({
        "userId": users,
        "movieId": movies.astype(np.int64),
        "rating": stars,
        "timestamp": values.integers(789_652_009, 1_427_784_002, liked.size),
    })
    return frame.sort_values(["userId", "movieId"], kind="stable", ignore_index=True)


def _candidates(rng: np.random.Generator, sizes: np.ndarray, start: int, n_items: int,
                rank: int) -> tuple[int, np.ndarray]:
    """(end of the chunk of users from ``start``, sorted candidate items [users, C]).

    Half of a user's candidates are drawn by popularity (log-uniform over the popularity
    ranks: P(rank r) ~ 1/r, Zipf's law as above), half uniformly over the catalogue (its long
    tail, which per-user ranking by popularity would never reach), ``_CANDIDATES`` times the
    largest item count of the chunk in all; the user then keeps the candidates that best
    match their taste. Popularity acts through the draw, so the affinity is taste alone.
    """
    width = _CANDIDATES * int(sizes[start])
    stop = start + 1
    while stop < sizes.size and stop - start < _CHUNK_USERS:
        wider = max(width, _CANDIDATES * int(sizes[stop]))
        if (stop + 1 - start) * wider * rank > _CHUNK_CELLS:
            break
        width, stop = wider, stop + 1
    users = stop - start
    popular = np.exp(rng.uniform(0.0, np.log(n_items + 1.0), (users, width - width // 2)))
    uniform = rng.integers(0, n_items, (users, width // 2))
    pool = np.concatenate([np.minimum(popular.astype(np.int64) - 1, n_items - 1), uniform], 1)
    return stop, np.sort(pool, axis=1)


def write_ratings_csv(frames: pd.DataFrame | Iterable[pd.DataFrame], path: Path) -> int:
    """Write ``frames`` (one frame, or blocks of one table in order) as MovieLens writes
    ``ratings.csv`` (header, no quoting, one decimal), a block at a time.

    Returns:
      The number of ratings written.
    """
    blocks = [frames] if isinstance(frames, pd.DataFrame) else frames
    written = 0
    with pa.OSFile(str(path), "wb") as sink:
        sink.write((",".join(RATINGS_COLUMNS) + "\n").encode())
        with pacsv.CSVWriter(sink, _SCHEMA, write_options=pacsv.WriteOptions(
                include_header=False, quoting_style="none")) as writer:
            for frame in blocks:
                writer.write_table(pa.table({
                    "userId": frame["userId"].to_numpy(),
                    "movieId": frame["movieId"].to_numpy(),
                    "rating": _format_ratings(frame["rating"].to_numpy()),
                    "timestamp": frame["timestamp"].to_numpy(),
                }, schema=_SCHEMA))
                written += len(frame)
    return written


def _format_ratings(ratings: np.ndarray) -> pa.Array:
    """Half-star ratings as ``"4.5"`` strings, vectorised through a lookup table."""
    halves = np.rint(ratings * 2).astype(np.int64)
    labels = pa.array([f"{h / 2:.1f}" for h in range(11)])
    return labels.take(pa.array(halves))
