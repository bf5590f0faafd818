"""Input pipeline: sharding per (epoch, rank) and CSR rows -> sparse batches."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from vaecf.train import data


def test_ranks_split_exactly_the_single_process_batches() -> None:
    single = data.epoch_users(10, seed=3, epoch=2, steps=3, batch_size=4, world_size=1, rank=0)
    ranks = [data.epoch_users(10, seed=3, epoch=2, steps=3, batch_size=4, world_size=2, rank=r)
             for r in range(2)]
    assert single.shape == (3, 4) and ranks[0].shape == (3, 2)
    np.testing.assert_array_equal(np.concatenate(ranks, axis=1), single)
    # one epoch = every user once, then the last batch wraps around to the start
    assert sorted(single.ravel()[:10]) == list(range(10))
    np.testing.assert_array_equal(single.ravel()[10:], single.ravel()[:2])


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
    batches = list(data.batches(maker, users))
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
    granule = data.pad_granule(matrix, 2048)
    assert granule & (granule - 1) == 0
    assert 2048 * 73 / 64 <= granule <= 2048 * 73 / 32


def test_csr_batch_keeps_rows_in_order() -> None:
    rows = sp.csr_matrix(np.array([[0, 1, 1], [1, 0, 0]], np.float32))
    batch = data.csr_batch(rows)
    np.testing.assert_array_equal(batch.rows.numpy(), [0, 0, 1])
    np.testing.assert_array_equal(batch.item_idx.numpy(), [1, 2, 0])
    np.testing.assert_array_equal(batch.user_idx.numpy(), [0, 1])


def test_device_resident_batches_equal_the_host_batches() -> None:
    # Real ML-20M-like rows (empty users included), several granules; on this CPU-only host the
    # "device" is the CPU, which runs the same ops the GPU path runs.
    rng = np.random.default_rng(5)
    matrix = sp.random(60, 45, density=0.1, format="csr", random_state=rng, dtype=np.float32)
    matrix.data[:] = 1.0
    matrix.data[matrix.indptr[7]:matrix.indptr[8]] = 0.0
    matrix.eliminate_zeros()
    assert matrix[7].nnz == 0
    users = data.epoch_users(60, seed=1, epoch=1, steps=5, batch_size=16, world_size=1, rank=0)
    for granule in (1, 8):
        host = list(data.batches(data.BatchMaker(matrix, granule), users))
        resident = list(data.batches(data.BatchMaker(matrix, granule, device="/CPU:0"), users))
        assert len(host) == len(resident) == 5
        for a, b in zip(host, resident, strict=True):
            for field_a, field_b in zip(a, b, strict=True):
                assert field_a.dtype == field_b.dtype
                np.testing.assert_array_equal(field_a.numpy(), field_b.numpy())
    assert any(7 in row for row in users)  # the empty user was in a batch



def test_resident_batches_leave_no_device_scope_open_between_steps() -> None:
    from tensorflow.python.eager import context

    matrix = sp.csr_matrix(np.eye(6, dtype=np.float32))
    users = data.epoch_users(6, seed=0, epoch=1, steps=2, batch_size=3, world_size=1, rank=0)
    outside = context.context().device_name
    batches = data.batches(data.BatchMaker(matrix, 1, device="/CPU:0"), users)
    next(batches)
    assert context.context().device_name == outside  # the caller's ops run in its own scope
    batches.close()


def test_resident_gather_pads_without_pad_and_takes_its_size_from_the_host() -> None:
    import tensorflow as tf

    matrix = sp.csr_matrix(np.eye(6, dtype=np.float32))
    maker = data.BatchMaker(matrix, 4, device="/CPU:0")
    graph = maker.resident_gather.get_concrete_function(
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
