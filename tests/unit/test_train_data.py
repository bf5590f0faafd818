"""Input pipeline: sharding per (epoch, rank) and CSR rows -> sparse batches."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import tensorflow as tf
from single_steps import gathered

from vaecf.train import data


def test_one_process_batches_are_the_epochs_seeded_permutation() -> None:
    single = data.epoch_users(10, seed=3, epoch=2, steps=3, batch_size=4, world_size=1, rank=0)
    order = np.random.default_rng([3, 2]).permutation(10)  # the key runs have always used
    np.testing.assert_array_equal(single.ravel(), np.resize(order, 12))
    # one epoch = every user once, then the last batch wraps around to the start
    assert sorted(single.ravel()[:10]) == list(range(10))
    np.testing.assert_array_equal(single.ravel()[10:], single.ravel()[:2])


def test_each_rank_draws_its_batches_from_its_own_share() -> None:
    """Rank r of W trains users [r*n/W, (r+1)*n/W) by its own permutation of them, for
    (seed, epoch, pass, rank); every rank takes the same steps, wrapping its shorter share."""
    everyone = data.all_ranks_users(11, seed=3, epoch=2, steps=3, batch_size=8, world_size=2)
    assert everyone.shape == (3, 2, 4)
    shares = [range(0, 5), range(5, 11)]
    for rank, share in enumerate(shares):
        ours = everyone[:, rank].ravel()
        assert data.user_share(11, 2, rank) == share
        assert sorted(ours[:len(share)]) == list(share)  # each of its users once, then wraps
        np.testing.assert_array_equal(ours[len(share):], ours[:12 - len(share)])
        np.testing.assert_array_equal(
            ours[:len(share)], share.start + np.random.default_rng([3, 2, 0, rank]).permutation(
                len(share)))
        np.testing.assert_array_equal(everyone[:, rank], data.epoch_users(
            11, seed=3, epoch=2, steps=3, batch_size=8, world_size=2, rank=rank))
    again = data.all_ranks_users(11, seed=3, epoch=2, steps=3, batch_size=8, world_size=2)
    np.testing.assert_array_equal(again, everyone)  # any rank computes every rank's users
    other_pass = data.all_ranks_users(11, seed=3, epoch=2, steps=3, batch_size=8,
                                      world_size=2, pass_index=1)
    assert not np.array_equal(other_pass, everyone)


def test_a_share_gathers_the_rows_the_whole_matrix_gathers() -> None:
    """A rank holding only its share's rows builds the batches a maker of the whole matrix
    builds for the same users (global user_idx kept); and one epoch size, from every user's
    lengths, is the same on every rank."""
    rng = np.random.default_rng(4)
    matrix = sp.random(30, 20, density=0.2, format="csr", random_state=rng, dtype=np.float32)
    matrix.data[:] = 1.0
    everyone = data.all_ranks_users(30, seed=0, epoch=1, steps=4, batch_size=6, world_size=2)
    lengths = np.diff(matrix.indptr).astype(np.int64)
    sizes = []
    for rank in (0, 1):
        share = data.user_share(30, 2, rank)
        part = matrix[share.start:share.stop]
        ours = gathered(data.BatchMaker(part, 4, first=share.start), everyone[:, rank])
        whole = gathered(data.BatchMaker(matrix, 4), everyone[:, rank])
        for a, b in zip(ours, whole, strict=True):
            for field_a, field_b in zip(a, b, strict=True):
                np.testing.assert_array_equal(field_a.numpy(), field_b.numpy())
        maker = data.BatchMaker(part, 4, one_size=True, first=share.start, lengths=lengths)
        sizes.append(maker.padded_sizes(everyone, rank))
    np.testing.assert_array_equal(sizes[0], sizes[1])
    assert sizes[0][0] >= lengths[everyone].sum(axis=2).max()


def test_each_epoch_has_its_own_seeded_permutation() -> None:
    def order(epoch: int, seed: int = 0) -> np.ndarray:
        return data.epoch_users(50, seed=seed, epoch=epoch, steps=1, batch_size=50,
                                world_size=1, rank=0)

    np.testing.assert_array_equal(order(1), order(1))
    assert not np.array_equal(order(1), order(2))
    assert not np.array_equal(order(1), order(1, seed=1))


def test_steps_per_epoch() -> None:
    assert data.steps_per_epoch(10, 4, None) == 3
    assert data.steps_per_epoch(8, 4, None) == 2
    assert data.steps_per_epoch(10, 4, 7) == 7


def test_batches_are_the_csr_rows_padded_with_zero_entries() -> None:
    matrix = sp.csr_matrix(np.array([[1, 0, 1, 0], [0, 0, 0, 0], [0, 1, 1, 1]], np.float32))
    maker = data.BatchMaker(matrix, granule=4)
    users = np.array([[2, 0], [1, 2]], np.int64)
    batches = gathered(maker, users)
    first = batches[0]
    assert first.rows.shape == (8,)  # 5 entries padded to a multiple of 4
    np.testing.assert_array_equal(first.rows.numpy()[:5], [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(first.item_idx.numpy()[:5], [1, 2, 3, 0, 2])
    np.testing.assert_array_equal(first.values.numpy(), [1, 1, 1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(first.user_idx.numpy(), [2, 0])
    second = batches[1]  # an empty user: its row simply has no entries
    np.testing.assert_array_equal(second.rows.numpy()[:3], [1, 1, 1])
    assert second.values.numpy().sum() == 3.0


def test_pad_granule_is_a_power_of_two_near_a_32nd_of_a_batch() -> None:
    matrix = sp.random(1000, 20000, density=73 / 20000, format="csr", random_state=0)
    granule = data.pad_granule(matrix.nnz, matrix.shape[0], 2048)
    assert granule & (granule - 1) == 0
    assert 2048 * 73 / 64 <= granule <= 2048 * 73 / 32


def test_csr_batch_keeps_rows_in_order() -> None:
    rows = sp.csr_matrix(np.array([[0, 1, 1], [1, 0, 0]], np.float32))
    batch = data.csr_batch(rows)
    np.testing.assert_array_equal(batch.rows.numpy(), [0, 0, 1])
    np.testing.assert_array_equal(batch.item_idx.numpy(), [1, 2, 0])
    np.testing.assert_array_equal(batch.user_idx.numpy(), [0, 1])


def test_gathered_batches_are_the_csr_rows_of_their_users() -> None:
    # ML-20M-like rows (empty users included), several granules, a device-resident maker
    # (on this CPU-only host the "device" is the CPU, which runs the ops the GPU path runs).
    rng = np.random.default_rng(5)
    matrix = sp.random(60, 45, density=0.1, format="csr", random_state=rng, dtype=np.float32)
    matrix.data[:] = rng.integers(1, 5, matrix.nnz)
    matrix.data[matrix.indptr[7]:matrix.indptr[8]] = 0.0
    matrix.eliminate_zeros()
    assert matrix[7].nnz == 0
    users = data.epoch_users(60, seed=1, epoch=1, steps=5, batch_size=16, world_size=1, rank=0)
    assert any(7 in row for row in users)  # the empty user is in a batch
    for granule, device in ((1, None), (8, "/CPU:0")):
        maker = data.BatchMaker(matrix, granule, device=device)
        padded = maker.padded_sizes(users[:, np.newaxis, :])
        for row, size, batch in zip(users, padded, gathered(maker, users), strict=True):
            rows = matrix[row]
            pad = int(size) - rows.nnz
            assert pad >= 0 and int(size) % granule == 0
            expected = (np.concatenate([np.repeat(np.arange(len(row)), np.diff(rows.indptr)),
                                        np.full(pad, len(row) - 1)]),
                        np.concatenate([rows.indices, np.zeros(pad)]),
                        np.concatenate([rows.data, np.zeros(pad)]), row)
            for field, want, dtype in zip(batch, expected, (tf.int64, tf.int64, tf.float32,
                                                            tf.int64), strict=True):
                assert field.dtype == dtype
                np.testing.assert_array_equal(field.numpy(), want)


def test_the_gather_pads_without_pad_and_takes_its_size_from_the_host() -> None:
    matrix = sp.csr_matrix(np.eye(6, dtype=np.float32))
    maker = data.BatchMaker(matrix, 4, device="/CPU:0")
    graph = tf.function(maker.gather).get_concrete_function(
        tf.constant([0, 1], tf.int64), tf.constant(8, tf.int64)).graph
    ops = {op.type: op for op in graph.get_operations()}
    assert "Pad" not in ops and "PadV2" not in ops  # int64 Pad has no GPU kernel
    limit = ops["Range"].inputs[1].op
    assert limit.type == "Placeholder"  # the host's argument, not a device-computed value


def test_bucket_rounds_up_to_at_most_four_sizes_per_doubling() -> None:
    assert [data.bucket(n, 16) for n in (1, 16, 17, 64, 65, 100, 129)] == [
        16, 16, 32, 64, 80, 112, 160]
    sizes = {data.bucket(n, 8) for n in range(8 * 64 + 1, 8 * 128 + 1)}  # (512, 1024]
    assert len(sizes) == 4 and all(s % 8 == 0 for s in sizes)
    assert all(n <= data.bucket(n, 8) < 1.25 * n + 8 for n in range(1, 5000))


def test_one_size_per_epoch_is_the_same_on_every_rank_and_fits_every_batch() -> None:
    rng = np.random.default_rng(2)
    matrix = sp.random(200, 50, density=0.2, format="csr", random_state=rng, dtype=np.float32)
    users = data.all_ranks_users(200, seed=0, epoch=1, steps=6, batch_size=20, world_size=2)
    maker = data.BatchMaker(matrix, 8, one_size=True)
    sizes = [maker.padded_sizes(users, rank) for rank in range(2)]
    np.testing.assert_array_equal(sizes[0], sizes[1])
    assert len(set(sizes[0])) == 1
    nnz = np.diff(matrix.indptr)[users].sum(axis=2)
    assert sizes[0][0] >= nnz.max() and len(set(nnz.ravel())) > 1  # the batches do vary
    per_step = data.BatchMaker(matrix, 8).padded_sizes(users, 1)
    assert len(set(per_step)) > 1 and (per_step >= nnz[:, 1]).all()
