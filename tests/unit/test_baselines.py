"""Popularity and EASE: hand-checked closed forms on tiny matrices."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from vaecf.baselines import Ease, Popularity, ease_weights
from vaecf.baselines.ease import _weights_from_lower_inverse, gram
from vaecf.errors import VaecfError
from vaecf.metrics import evaluate

# Four users, two items: item 0 has 3 users, item 1 has 2, one user has both.
TRAIN = sp.csr_matrix(np.array([[1, 1], [1, 0], [1, 0], [0, 1]], dtype=np.float32))


def test_ease_two_items_by_hand() -> None:
    # G + lambda I = [[3 + l, 1], [1, 2 + l]]; its inverse is [[2 + l, -1], [-1, 3 + l]] / det,
    # so B_01 = -P_01 / P_11 = 1 / (3 + l) and B_10 = 1 / (2 + l). With lambda = 1:
    weights = ease_weights(TRAIN, 1.0)
    np.testing.assert_allclose(weights, [[0.0, 1 / 4], [1 / 3, 0.0]], rtol=1e-6)
    # A user with item 0 gets item 1 scored 1/4 (and nothing for item 0 itself).
    scores = Ease(TRAIN, 1.0)(sp.csr_matrix(np.array([[1, 0]], dtype=np.float32)))
    np.testing.assert_allclose(scores, [[0.0, 0.25]], rtol=1e-6)


def test_ease_matches_the_dense_formula_with_a_zero_diagonal() -> None:
    rng = np.random.default_rng(3)
    train = sp.csr_matrix((rng.random((80, 30)) < 0.2).astype(np.float32) * 5)  # values ignored
    binary = (train.toarray() > 0).astype(np.float64)
    inverse = np.linalg.inv(binary.T @ binary + 7.0 * np.eye(30))
    expected = -inverse / np.diag(inverse)
    np.fill_diagonal(expected, 0.0)
    weights = ease_weights(train, 7.0)
    assert weights.dtype == np.float32
    assert np.all(np.diag(weights) == 0.0)
    np.testing.assert_allclose(weights, expected, rtol=0, atol=1e-6)


def test_blockwise_gram_and_weights_equal_the_one_block_result() -> None:
    rng = np.random.default_rng(4)
    train = sp.csr_matrix((rng.random((50, 11)) < 0.3).astype(np.float32))
    dense = train.toarray().astype(np.float64)
    np.testing.assert_array_equal(gram(train, block=3), dense.T @ dense)
    spd = dense.T @ dense + 2.0 * np.eye(11)
    inverse = np.linalg.inv(spd)
    lower = np.tril(inverse) + np.triu(np.full((11, 11), 99.0), 1)  # upper: garbage, unused
    expected = (inverse / -np.diag(inverse)).astype(np.float32)
    np.fill_diagonal(expected, 0.0)
    np.testing.assert_allclose(_weights_from_lower_inverse(lower, block=4), expected, atol=1e-7)


def test_ease_refuses_a_non_positive_lambda() -> None:
    with pytest.raises(VaecfError, match="ease-lambda"):
        ease_weights(TRAIN, 0.0)


def test_popularity_scores_are_train_counts_and_skip_fold_in() -> None:
    train = sp.csr_matrix(np.array([[1, 1, 0], [0, 1, 1], [0, 1, 0]], dtype=np.float32))
    popularity = Popularity(train)
    rows = sp.csr_matrix(np.array([[0, 1, 0], [0, 0, 0]], dtype=np.float32))
    np.testing.assert_array_equal(popularity(rows), [[1, 3, 1], [1, 3, 1]])
    # User 0 has item 1 (the most popular); items 0 and 2 tie at 1 -> item 0 first.
    fold_in = rows
    holdout = sp.csr_matrix(np.array([[1, 0, 0], [0, 0, 1]], dtype=np.float32))
    result = evaluate(popularity, fold_in, holdout, engine="numpy", top_k=3)
    assert result.top_k is not None
    assert result.top_k.item_idx.tolist() == [[0, 2, -1], [1, 0, 2]]


def test_ease_shows_progress_through_every_long_step(capfd: pytest.CaptureFixture[str]
                                                     ) -> None:
    """Gram matrix, factorisation, inverse and weights each log (no minutes of silence)."""
    ease_weights(TRAIN, 1.0)
    out = capfd.readouterr().out
    for step in ("EASE Gram matrix: 2/2 items", "EASE: Cholesky factorisation: done (",
                 "EASE: inverse from the factor: done (", "EASE weights: 2/2 items"):
        assert step in out, out
