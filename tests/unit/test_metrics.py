"""Recall@K and NDCG@K: hand-computed cases, a brute-force cross-check, and TF == numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from vaecf.errors import VaecfError
from vaecf.metrics import evaluate, mean_stderr, ndcg_at_k, rank_top_k, recall_at_k
from vaecf.metrics.reference import METRICS, metrics_from_ranking

LOG2_3 = math.log2(3)


def csr(rows: list[list[int]], n_items: int) -> sp.csr_matrix:
    """A binary CSR matrix whose row u holds the items ``rows[u]``."""
    dense = np.zeros((len(rows), n_items), dtype=np.float32)
    for user, items in enumerate(rows):
        dense[user, items] = 1.0
    return sp.csr_matrix(dense)


def one_user(scores: list[float], fold_in: list[int], holdout: list[int], k: int
             ) -> tuple[float, float]:
    n = len(scores)
    args = (np.array([scores], dtype=np.float32), csr([fold_in], n), csr([holdout], n), k)
    return float(recall_at_k(*args)[0]), float(ndcg_at_k(*args)[0])


def test_ties_rank_the_lower_item_idx_first() -> None:
    # Items 1, 2, 4 tie at 3.0, so the ranking is 1, 2, 4, 3, 0: holdout item 2 is 2nd.
    assert one_user([1, 3, 3, 2, 3], [], [2], 1) == (0.0, 0.0)
    recall, ndcg = one_user([1, 3, 3, 2, 3], [], [2], 2)
    assert recall == 1.0
    assert ndcg == pytest.approx(1 / LOG2_3, abs=1e-12)
    assert rank_top_k(np.array([[1, 3, 3, 2, 3]]), csr([[]], 5), 5).tolist() == [[1, 2, 4, 3, 0]]


def test_fold_in_items_are_excluded_from_the_ranking() -> None:
    # Ranking without fold-in {0, 1}: 2, 3, 4; holdout {2, 4} -> hits at ranks 1 and 3.
    recall, ndcg = one_user([5, 4, 3, 2, 1], [0, 1], [2, 4], 2)
    assert recall == 0.5
    assert ndcg == pytest.approx(1 / (1 + 1 / LOG2_3), abs=1e-12)


def test_k_larger_than_the_item_count() -> None:
    # K = 10 > 5 items: the ranking 2, 3, 4 is all there is; the denominators use min(K, |H|).
    recall, ndcg = one_user([5, 4, 3, 2, 1], [0, 1], [2, 4], 10)
    assert recall == 1.0
    assert ndcg == pytest.approx((1 + 1 / 2) / (1 + 1 / LOG2_3), abs=1e-12)
    assert rank_top_k(np.array([[5, 4, 3, 2, 1]]), csr([[0, 1]], 5), 10).tolist() == [
        [2, 3, 4, -1, -1]]


def test_one_holdout_item() -> None:
    assert one_user([3, 2, 1, 0], [], [2], 2) == (0.0, 0.0)
    assert one_user([3, 2, 1, 0], [], [2], 3) == (1.0, 0.5)  # 1 / log2(3 + 1)


def test_all_hits_and_no_hits() -> None:
    assert one_user([3, 2, 1, 0], [], [0, 1], 2) == (1.0, 1.0)
    assert one_user([3, 2, 1, 0], [], [2, 3], 2) == (0.0, 0.0)


def test_holdout_larger_than_k_is_normalised_by_k() -> None:
    # Ranking 2, 0, 1, 3 and |H| = 3 > K = 2: two hits out of min(2, 3).
    assert one_user([1, 0.5, 2, 0], [], [0, 1, 2], 2) == (1.0, 1.0)


def test_empty_holdout_is_refused_by_the_reference() -> None:
    with pytest.raises(ValueError, match="non-empty holdout"):
        one_user([1, 2], [], [], 1)


def test_mean_stderr_uses_the_population_std() -> None:
    assert mean_stderr(np.array([1.0, 0.0])) == (0.5, 0.5 / math.sqrt(2))
    assert mean_stderr(np.array([0.25])) == (0.25, 0.0)


def brute_force(scores: np.ndarray, fold_in: set[int], holdout: set[int], k: int
                ) -> tuple[float, float]:
    """Recall@K and NDCG@K of one user, straight from the definitions."""
    candidates = [i for i in range(len(scores)) if i not in fold_in]
    ranking = sorted(candidates, key=lambda i: (-scores[i], i))[:k]
    hits = [1.0 if item in holdout else 0.0 for item in ranking]
    dcg = sum(hit / math.log2(rank + 2) for rank, hit in enumerate(hits))
    idcg = sum(1 / math.log2(rank + 2) for rank in range(min(k, len(holdout))))
    return sum(hits) / min(k, len(holdout)), dcg / idcg


def random_case(rng: np.random.Generator, users: int, n_items: int
                ) -> tuple[np.ndarray, sp.csr_matrix, sp.csr_matrix]:
    """Integer scores (many ties), disjoint fold-in and holdout, every holdout non-empty."""
    scores = rng.integers(0, 6, (users, n_items)).astype(np.float32)
    draw = rng.random((users, n_items))
    fold_in = draw < 0.3
    holdout = (draw > 0.85) | (np.arange(n_items) == rng.integers(0, n_items, (users, 1)))
    holdout &= ~fold_in
    holdout[~holdout.any(axis=1), -1] = True
    fold_in[:, -1] &= ~holdout[:, -1]
    return scores, sp.csr_matrix(fold_in.astype(np.float32)), sp.csr_matrix(
        holdout.astype(np.float32))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [1, 3, 20, 100])
def test_reference_equals_brute_force(seed: int, k: int) -> None:
    rng = np.random.default_rng(seed)
    scores, fold_in, holdout = random_case(rng, 30, 40)
    recall = recall_at_k(scores, fold_in, holdout, k)
    ndcg = ndcg_at_k(scores, fold_in, holdout, k)
    for user in range(30):
        expected = brute_force(scores[user], set(fold_in[user].indices),
                               set(holdout[user].indices), k)
        assert (recall[user], ndcg[user]) == pytest.approx(expected, abs=1e-12)


def test_evaluate_excludes_and_counts_users_with_empty_holdout() -> None:
    # User 0: holdout item 0 ranked 1st; user 1: empty holdout (skipped, not averaged);
    # user 2: holdout item 3 ranked 4th of 4. Recall@20 = 1 for both, NDCG@100 1 and 1/log2(5).
    scores = np.array([[4, 3, 2, 1]] * 3, dtype=np.float32)
    fold_in, holdout = csr([[], [0], []], 4), csr([[0], [], [3]], 4)
    result = evaluate(lambda rows: scores[: rows.shape[0]], fold_in, holdout, batch_users=2)
    assert (result.users_evaluated, result.users_skipped) == (2, 1)
    assert result.metrics["recall_at_20"].mean == 1.0
    ndcg = [1.0, 1 / math.log2(5)]
    assert result.metrics["ndcg_at_100"].mean == pytest.approx(np.mean(ndcg), abs=1e-12)
    assert result.metrics["ndcg_at_100"].stderr == pytest.approx(np.std(ndcg) / math.sqrt(2))
    summary = result.summary()
    assert set(summary) == {"recall_at_20", "recall_at_50", "ndcg_at_100", "users_evaluated",
                            "users_skipped"}
    assert summary["ndcg_at_100"] == {"mean": result.metrics["ndcg_at_100"].mean,
                                      "stderr": result.metrics["ndcg_at_100"].stderr}


def test_evaluate_refuses_bad_scorers_and_inputs() -> None:
    fold_in, holdout = csr([[0], [1]], 3), csr([[1], [2]], 3)
    with pytest.raises(VaecfError, match="shape"):
        evaluate(lambda rows: np.zeros((rows.shape[0], 2), np.float32), fold_in, holdout)
    with pytest.raises(VaecfError, match="NaN or infinite"):
        evaluate(lambda rows: np.full((rows.shape[0], 3), np.nan, np.float32), fold_in, holdout)
    with pytest.raises(VaecfError, match="nothing to evaluate"):
        evaluate(lambda rows: np.zeros((rows.shape[0], 3)), fold_in, csr([[], []], 3))
    with pytest.raises(VaecfError, match="batch_users"):
        evaluate(lambda rows: np.zeros((rows.shape[0], 3)), fold_in, holdout, batch_users=0)


@pytest.mark.parametrize("engine", ["tensorflow", "numpy"])
def test_every_user_is_evaluated_including_the_last_partial_chunk(engine: str) -> None:
    rng = np.random.default_rng(7)
    _, fold_in, holdout = random_case(rng, 50, 130)
    weights = rng.normal(size=(130, 130)).astype(np.float32)
    seen: list[int] = []

    def score_batch(rows: sp.csr_matrix) -> np.ndarray:
        seen.append(rows.shape[0])
        return np.asarray(rows @ weights, dtype=np.float32)

    result = evaluate(score_batch, fold_in, holdout, batch_users=7, engine=engine, top_k=5)
    assert seen == [7] * 7 + [1]
    whole = metrics_from_ranking(rank_top_k(fold_in @ weights, fold_in, 100), holdout)
    for key, _, _ in METRICS:
        assert result.metrics[key].mean == pytest.approx(whole[key].mean(), abs=1e-6)
        assert result.metrics[key].stderr == pytest.approx(mean_stderr(whole[key])[1], abs=1e-6)
    assert result.top_k is not None and result.top_k.item_idx.shape == (50, 5)
    assert not np.take_along_axis(fold_in.toarray(), result.top_k.item_idx, axis=1).any()


@pytest.mark.parametrize(("seed", "n_items", "blocked"),
                         [(0, 40, False), (1, 40, False), (2, 250, False), (3, 9000, True)])
def test_tensorflow_chunk_equals_the_reference_per_user(seed: int, n_items: int,
                                                        blocked: bool) -> None:
    from vaecf.metrics.batched import ChunkMetrics

    rng = np.random.default_rng(seed)
    _, fold_in, holdout = random_case(rng, 23, n_items)
    # Half the users get continuous scores, half integer scores full of ties.
    scores = rng.normal(size=(23, n_items)).astype(np.float32)
    scores[::2] = np.round(scores[::2])
    out = ChunkMetrics(n_items, METRICS, top_k=120, blocked_top_k=blocked)(
        scores, fold_in, holdout)
    top = rank_top_k(scores, fold_in, 120)
    expected = metrics_from_ranking(top, holdout)
    for key, _, _ in METRICS:
        np.testing.assert_allclose(out[key], expected[key], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(out["top_items"], top)
    assert out["top_items"].shape == (23, min(120, n_items))


@pytest.mark.parametrize("engine", ["tensorflow", "numpy"])
def test_holdout_item_also_in_fold_in_counts_but_never_hits(engine: str) -> None:
    # Ranking without fold-in {0}: 1, 2. |H| = 2 (item 0 included, unrankable), one hit at 1.
    fold_in, holdout = csr([[0]], 3), csr([[0, 1]], 3)
    result = evaluate(lambda rows: np.array([[3, 2, 1]], np.float32), fold_in, holdout,
                      engine=engine)
    assert result.metrics["recall_at_20"].mean == 0.5
    assert result.metrics["ndcg_at_100"].mean == pytest.approx(1 / (1 + 1 / LOG2_3), abs=1e-12)


def test_users_per_second_is_whole_chunks_after_the_first() -> None:
    from vaecf.metrics import Evaluation

    def timed(users: int, batch: int, *chunks: float) -> Evaluation:
        return Evaluation(metrics={}, users_evaluated=users, users_skipped=0,
                          seconds=sum(chunks), device="cpu", batch_users=batch,
                          chunk_seconds=chunks)

    # Chunks of 3: 3 (start-up, 5 s), 3 (1 s), 3 (2 s), 1 (partial, 0.5 s): 6 users in 3 s.
    ten = timed(10, 3, 5.0, 1.0, 2.0, 0.5)
    assert ten.users_per_second == 2.0
    assert (ten.first_chunk_users, ten.first_chunk_seconds) == (3, 5.0)
    assert ten.steady_chunks == (1.0, 2.0)
    assert timed(6, 3, 5.0, 1.5).users_per_second == 2.0  # no partial chunk: 3 users / 1.5 s
    # No whole chunk after the first: no rate (not start-up's, not a partial chunk's).
    assert timed(4, 3, 5.0, 0.1).users_per_second is None
    assert timed(3, 3, 5.0).users_per_second is None
    assert timed(2, 3, 5.0).first_chunk_users == 2


def test_evaluate_times_every_chunk() -> None:
    fold_in, holdout = csr([[0]] * 7, 4), csr([[1]] * 7, 4)
    result = evaluate(lambda rows: np.ones((rows.shape[0], 4), np.float32), fold_in, holdout,
                      batch_users=3)
    assert result.batch_users == 3 and len(result.chunk_seconds) == 3  # 3 + 3 + 1 users
    assert len(result.steady_chunks) == 1 and result.users_per_second is not None
    assert sum(result.chunk_seconds) <= result.seconds


@pytest.mark.parametrize("seed", range(3))
def test_block_top_k_equals_tf_top_k_and_the_reference_with_ties(seed: int) -> None:
    import tensorflow as tf

    from vaecf.metrics.batched import BLOCK_ITEMS, block_top_k, top_k

    rng = np.random.default_rng(seed)
    n_items, k = 4 * BLOCK_ITEMS + 100, 100  # 5 blocks, the last padded
    # Ties within and across blocks: one decimal of a normal draw; equal top scores on both
    # sides of a block boundary; a row of 50 finite scores, the rest -inf (masked fold-in),
    # whose top 100 holds 50 -inf ranked by column, never the padding's.
    scores = np.round(rng.normal(size=(16, n_items)), 1).astype(np.float32)
    scores[0, [BLOCK_ITEMS - 1, BLOCK_ITEMS, 5]] = 9.0
    scores[1, np.setdiff1d(np.arange(n_items), rng.choice(n_items, 50, replace=False))] = -np.inf
    # The reference takes finite scores only; -1e30 ranks as -inf does (last, ties by column).
    expected = rank_top_k(np.maximum(scores, -1e30), sp.csr_matrix((16, n_items),
                                                                   dtype=np.float32), k)
    assert list(expected[0, :3]) == [5, BLOCK_ITEMS - 1, BLOCK_ITEMS]
    values, indices, exhausted = block_top_k(tf.constant(scores), k)
    assert not bool(exhausted)  # the two-stage result itself is compared, no fallback
    np.testing.assert_array_equal(indices.numpy(), expected)
    reference = tf.math.top_k(scores, k=k)
    np.testing.assert_array_equal(values.numpy(), reference.values.numpy())
    np.testing.assert_array_equal(indices.numpy(), reference.indices.numpy())
    for blocked in (True, False):
        both = top_k(tf.constant(scores), k, blocked)
        np.testing.assert_array_equal(both[1].numpy(), expected)


def test_block_top_k_falls_back_when_a_block_runs_out() -> None:
    import tensorflow as tf

    from vaecf.metrics.batched import BLOCK_ITEMS, BLOCK_K, block_top_k, top_k

    # Equal scores rank by column: the top 100 are columns 0-99, all in block 0, which has
    # only 99 candidates; so do the top 120 of scores rising toward block 0's end.
    n_items = 5 * BLOCK_ITEMS
    flat = np.zeros((2, n_items), np.float32)
    flat[1, :BLOCK_ITEMS] = np.arange(BLOCK_ITEMS)
    for k in (100, 120):
        _, _, exhausted = block_top_k(tf.constant(flat), k)
        assert bool(exhausted)
        expected = rank_top_k(flat, sp.csr_matrix(flat.shape, dtype=np.float32), k)
        np.testing.assert_array_equal(top_k(tf.constant(flat), k, True)[1].numpy(), expected)
        assert expected[1, BLOCK_K] == BLOCK_ITEMS - 1 - BLOCK_K  # beyond block 0's 99


def test_blocked_chunk_never_sorts_whole_rows_but_in_its_fallback() -> None:
    # TensorFlow's GPU TopK sorts whole rows for k >= 100: the chunk's only such TopK over
    # all items must be the fallback's, inside a cond branch (a separate function graph).
    from vaecf.metrics.batched import ChunkMetrics

    n_items = 20_108
    graph = ChunkMetrics(n_items, METRICS, blocked_top_k=True)._fn.get_concrete_function().graph
    ops = graph.get_operations()
    tops = [(int(op.inputs[0].shape[-1]), int(op.inputs[1].op.get_attr("value").int_val[0]))
            for op in ops if op.type == "TopKV2"]
    assert tops and all(k < 100 or columns < n_items for columns, k in tops), tops
    assert any(op.type in ("If", "StatelessIf") for op in ops)


@pytest.mark.parametrize("blocked", [True, False])
def test_top_k_indices_become_int64_at_once(blocked: bool) -> None:
    # A GPU keeps int32 tensors in host memory for Reshape, StridedSlice, AddV2, Identity
    # (TensorFlow 2.17's GPU kernel registry): TopK's int32 indices may only feed a Cast.
    from vaecf.metrics.batched import ChunkMetrics

    chunk = ChunkMetrics(20_108, METRICS, top_k=10, blocked_top_k=blocked)
    graph = chunk._fn.get_concrete_function().graph
    tops = [op for op in graph.get_operations() if op.type == "TopKV2"]
    assert tops
    for op in tops:
        assert {c.type for c in op.outputs[1].consumers()} == {"Cast"}, op.name


def test_paired_difference_by_hand() -> None:
    from vaecf.metrics.reference import paired_difference

    # d = [0.1, 0.3]: mean 0.2, population std 0.1, stderr 0.1 / sqrt(2), z = 2 * sqrt(2)
    found = paired_difference(np.array([0.5, 0.6]), np.array([0.4, 0.3]))
    assert found["delta"] == pytest.approx(0.2) and found["users"] == 2
    assert found["stderr"] == pytest.approx(0.1 / np.sqrt(2))
    assert found["z"] == pytest.approx(2 * np.sqrt(2))
    assert paired_difference(np.ones(3), np.ones(3))["z"] is None
