"""The SavedModel's raw-id signature ``recommend_ids``, through TensorFlow (as TF Serving
loads it): id map, own items masked, unknown ids counted, popularity fallback, per-user k;
and the predictor's batching of concurrent requests into one model call."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from vaecf.baselines import Popularity
from vaecf.errors import VaecfError
from vaecf.model import MultVAE
from vaecf.serve.model import ServedModel, item_id_map
from vaecf.train.export import export

N_ITEMS = 12
IDS = np.arange(100, 100 + N_ITEMS)  # raw ids 100..111 (integers, matched as text)
# Training users per item: item 105 most popular, then 101, 110, ... (ties broken by index).
TRAIN = sp.csr_matrix(np.array([[1 if item in row else 0 for item in range(N_ITEMS)]
                                for row in ([5, 1, 10], [5, 1], [5, 10], [5], [1])]))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = MultVAE(N_ITEMS, hidden=8, latent=4, dropout=0.0, policy="float32")
    model.build_variables()
    path = tmp_path_factory.mktemp("export") / "saved_model"
    export(model.get_weights(), n_items=N_ITEMS, hidden=8, latent=4, path=path, item_ids=IDS,
           popularity=Popularity(TRAIN).counts)
    return path


def call(saved: Path, users: list[list[str]], k: list[int]) -> dict[str, np.ndarray]:
    loaded = tf.saved_model.load(str(saved))
    width = max(len(u) for u in users)
    items = [u + [""] * (width - len(u)) for u in users]
    out = loaded.signatures["recommend_ids"](items=tf.constant(items), k=tf.constant(k))
    return {name: value.numpy() for name, value in out.items()}


def test_raw_ids_rank_like_the_index_signature_without_own_items(saved: Path) -> None:
    loaded = tf.saved_model.load(str(saved))
    by_index = loaded.signatures["recommend"](row_splits=tf.constant([0, 2], tf.int64),
                                              item_idx=tf.constant([3, 7], tf.int64),
                                              k=tf.constant(N_ITEMS - 2))
    out = call(saved, [["103", "107", "103"]], [N_ITEMS - 2])  # a duplicate counts once
    expected = [str(IDS[i]).encode() for i in by_index["item_idx"].numpy()[0]]
    assert out["item_id"][0].tolist() == expected
    np.testing.assert_allclose(out["scores"][0], by_index["scores"].numpy()[0], rtol=1e-6)
    assert b"103" not in out["item_id"][0] and b"107" not in out["item_id"][0]
    assert out["unknown"].tolist() == [0] and out["fallback"].tolist() == [False]


def test_unknown_ids_are_counted_and_a_user_with_none_known_gets_popularity(saved: Path
                                                                           ) -> None:
    out = call(saved, [["nope", "103", "999"], ["nope"], []], [3, 3, 2])
    assert out["unknown"].tolist() == [2, 1, 0]  # padding "" is not an unknown id
    assert out["fallback"].tolist() == [False, True, True]
    assert out["item_id"][1].tolist() == [b"105", b"101", b"110"]
    assert out["scores"][1].tolist() == [4.0, 3.0, 2.0]  # training users per item
    assert out["item_id"][2].tolist() == [b"105", b"101", b""]  # k=2 of a batch of k<=3
    assert out["scores"][2][2] == -np.inf


def test_k_is_capped_at_the_items_left(saved: Path) -> None:
    out = call(saved, [[str(i) for i in IDS[:10]]], [50])
    assert out["item_id"].shape == (1, N_ITEMS)
    assert sorted(out["item_id"][0][:2].tolist()) == [b"110", b"111"]
    assert out["item_id"][0][2:].tolist() == [b""] * (N_ITEMS - 2)


def test_served_model_uses_the_same_map(saved: Path) -> None:
    loaded = tf.saved_model.load(str(saved))
    assert item_id_map(loaded, "m").tolist() == [str(i) for i in IDS]
    ranking = ServedModel(loaded, "m").recommend([["nope"], ["103", "107"]], [2, 1])
    assert ranking.item_ids[0].tolist() == ["105", "101"]
    assert ranking.unknown.tolist() == [1, 0] and ranking.fallback.tolist() == [True, False]
    assert ranking.item_ids[1][1] == ""


def test_a_model_without_the_map_is_refused_in_one_line(tmp_path: Path) -> None:
    class Old(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
        def score(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"scores": tf.cast(x, tf.float32)}

    old = Old()
    tf.saved_model.save(old, str(tmp_path / "old"), signatures={"score": old.score})
    with pytest.raises(VaecfError, match=r"^m: this SavedModel has no item id map"):
        item_id_map(tf.saved_model.load(str(tmp_path / "old")), "m")


def test_ids_must_be_distinct(tmp_path: Path) -> None:
    model = MultVAE(3, hidden=4, latent=2, dropout=0.0, policy="float32")
    model.build_variables()
    with pytest.raises(ValueError, match="expected 3 distinct ids"):
        export(model.get_weights(), n_items=3, hidden=4, latent=2, path=tmp_path / "m",
               item_ids=np.array([1, 1, 2]), popularity=np.zeros(3))


def test_waiting_requests_share_one_model_call(saved: Path) -> None:
    from vaecf.serve.predictor import Predictor

    served = ServedModel(tf.saved_model.load(str(saved)), "m")
    calls: list[int] = []
    recommend = served.recommend
    served.recommend = lambda users, k: calls.append(len(users)) or recommend(users, k)
    predictor = Predictor("vaecf", "unused", max_batch_users=256)
    predictor.served = served
    bodies = [{"instances": [{"items": [str(IDS[i])], "k": 3}] * (1 + i % 2)} for i in range(6)]

    async def together() -> list[dict]:
        return await asyncio.gather(*(predictor.predict(body) for body in bodies))

    answers = asyncio.run(together())
    assert calls == [9]  # six requests, nine users, one call
    for i, answer in enumerate(answers):
        alone = recommend([[str(IDS[i])]], [3]).item_ids[0].tolist()
        assert [p["item_id"] for p in answer["predictions"]] == [alone] * (1 + i % 2)


def test_tf_serving_answers_recommend_ids_by_default(saved: Path) -> None:
    loaded = tf.saved_model.load(str(saved))
    default = loaded.signatures["serving_default"]
    assert sorted(default.structured_input_signature[1]) == ["items", "k"]
    assert sorted(default.structured_outputs) == ["fallback", "item_id", "scores", "unknown"]


def test_model_calls_never_exceed_the_warm_up_s_users_or_cells() -> None:
    from vaecf.serve.predictor import calls

    users = [["a"] * n for n in (1, 1, 1, 10, 2, 0, 30, 1)]
    cuts = calls(users, max_users=3, max_cells=30)
    assert cuts == [(0, 3), (3, 6), (6, 7), (7, 8)]  # 3 users; 3 x 10; 1 x 30; the rest
    for start, stop in cuts:
        width = max(1, *(len(u) for u in users[start:stop]))
        assert stop - start <= 3 and (stop - start) * width <= 30
    assert calls(users[:1], max_users=3, max_cells=30) == [(0, 1)]


def test_rankings_of_consecutive_calls_join_into_one() -> None:
    from vaecf.serve.model import Ranking

    a = Ranking(np.array([["x", "y"]], dtype=object), np.array([[2.0, 1.0]], np.float32),
                np.array([0], np.int32), np.array([False]))
    b = Ranking(np.array([["z"], ["w"]], dtype=object), np.array([[3.0], [4.0]], np.float32),
                np.array([1, 2], np.int32), np.array([True, False]))
    joined = Ranking.join([a, b])
    assert joined.item_ids.tolist() == [["x", "y"], ["z", ""], ["w", ""]]
    assert joined.scores.tolist() == [[2.0, 1.0], [3.0, -np.inf], [4.0, -np.inf]]
    assert joined.unknown.tolist() == [0, 1, 2] and joined.fallback.tolist() == [False, True,
                                                                                 False]
