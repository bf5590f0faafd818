"""A million-item catalogue through the data, split and evaluation code with few users: no
dense [users x items] or [items x items] array, and EASE refused before it allocates one."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from vaecf.baselines import Ease, Popularity
from vaecf.baselines.ease import check_fits, needed_bytes
from vaecf.data.split import SplitConfig, split_interactions, write_split
from vaecf.data.splits import load_split
from vaecf.data.synthetic import generate_ratings
from vaecf.errors import VaecfError
from vaecf.metrics import evaluate
from vaecf.metrics.evaluation import SCORE_CELLS, chunk_users

MILLION = 1_000_000


def test_scoring_chunks_shrink_with_the_catalogue() -> None:
    assert chunk_users(4096, 20_108) == 4096  # ML-20M: the flag's chunk, unchanged
    assert chunk_users(4096, MILLION) == SCORE_CELLS // MILLION == 134
    assert chunk_users(4096, 10 * SCORE_CELLS) == 1


def test_synthetic_ratings_over_a_million_items_draw_a_chunk_at_a_time() -> None:
    tracemalloc.start()
    ratings = generate_ratings(70, MILLION, seed=0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # ~33 bytes per (user, item) cell drawn at once: 70 users x 1M items would be 2.3 GB,
    # a chunk of 33 users is 1.1 GB.
    assert peak < 1536 << 20, f"peak {peak / 2**20:.0f} MiB"
    assert ratings["userId"].nunique() == 70
    assert ratings["movieId"].nunique() > 5_000  # the catalogue's tail is reached


def test_a_million_item_split_is_written_and_evaluated_in_bounded_chunks(
        tmp_path: Path) -> None:
    # Every item twice, each time to one of 800 users, so held-out users share items with
    # training users: 2M pairs, ~88% of the items in the training users' universe.
    rng = np.random.default_rng(0)
    pairs = pd.DataFrame({"user_id": np.tile(np.repeat(np.arange(800), 1_250), 2),
                          "item_id": np.concatenate([rng.permutation(MILLION)
                                                     for _ in range(2)])}).drop_duplicates()
    config = SplitConfig(seed=0, val_fraction=0.3, test_fraction=0.05)
    manifest = write_split(split_interactions(pairs, config), tmp_path, inputs={},
                           parameters={}, started=0.0, dataset="synthetic")
    split = load_split(tmp_path)
    assert manifest["n_items"] == split.n_items > 800_000  # the training users' items
    fold_in, holdout = split.heldout("val")
    assert fold_in.shape[0] > chunk_users(4096, split.n_items)  # more than one chunk

    seen: list[int] = []
    popularity = Popularity(split.train)

    def score(rows: sp.csr_matrix) -> np.ndarray:
        seen.append(rows.shape[0])
        return popularity(rows)

    result = evaluate(score, fold_in, holdout, batch_users=4096)
    assert max(seen) == chunk_users(4096, split.n_items) and sum(seen) == fold_in.shape[0]
    assert result.users_evaluated == fold_in.shape[0]
    assert 0.0 <= result.metrics["ndcg_at_100"].mean <= 1.0


def test_ease_memory_rule() -> None:
    assert needed_bytes(20_000) == 12 * 20_000**2  # float64 Gram + float32 weights: 4.8 GB
    check_fits(20_000, 5 * 10**9)
    with pytest.raises(VaecfError, match=r"EASE: 20,000 items need 4.5 GiB .* 3.7 GiB"):
        check_fits(20_000, 4 * 10**9)


def test_ease_refuses_a_million_items_before_allocating() -> None:
    train = sp.csr_matrix((np.ones(3, np.float32), ([0, 1, 2], [0, 5, MILLION - 1])),
                          shape=(3, MILLION))
    with pytest.raises(VaecfError, match=r"EASE: 1,000,000 items need 11,175\.9 GiB"):
        Ease(train)
