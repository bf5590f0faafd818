"""A ``vaecf train`` output loaded for serving: its ``recommend_ids`` signature and id map.

The SavedModel alone answers in raw ids (``vaecf.train.export``): the id map, the popularity
fallback and the masking of a user's own items all live in the graph, so ``vaecf serve``,
``vaecf recommend`` and TF Serving give the same answer for the same request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vaecf.errors import VaecfError
from vaecf.io import open_input, read_manifest

SIGNATURE = "recommend_ids"


@dataclass(frozen=True)
class Ranking:
    """The answer for a batch of B users, K = the largest k asked.

    Attributes:
      item_ids: object [B, K], raw ids as text; "" past a user's own k.
      scores: float32 [B, K], the model's logits (training users per item for a fallback
        user); -inf past a user's own k.
      unknown: int32 [B], ids of the request the model does not know (ignored).
      fallback: bool [B], the user had no known item: the ranking is the training popularity.
    """

    item_ids: np.ndarray
    scores: np.ndarray
    unknown: np.ndarray
    fallback: np.ndarray

    @classmethod
    def join(cls, parts: list[Ranking]) -> Ranking:
        """The rankings of consecutive slices of users as one (narrower ones padded)."""
        width = max(part.item_ids.shape[1] for part in parts)

        def pad(array: np.ndarray, fill: Any) -> np.ndarray:
            return np.pad(array, ((0, 0), (0, width - array.shape[1])), constant_values=fill)

        return cls(np.concatenate([pad(p.item_ids, "") for p in parts]),
                   np.concatenate([pad(p.scores, -np.inf) for p in parts]),
                   np.concatenate([p.unknown for p in parts]),
                   np.concatenate([p.fallback for p in parts]))

    def rows(self, start: int, stop: int, width: int) -> Ranking:
        """Users ``start:stop`` and their first ``width`` places (one request of a batch)."""
        return Ranking(self.item_ids[start:stop, :width], self.scores[start:stop, :width],
                       self.unknown[start:stop], self.fallback[start:stop])


def item_id_map(loaded: Any, where: str) -> np.ndarray:
    """The raw id (text) of each item_idx, (n_items,), from a loaded SavedModel.

    Raises:
      VaecfError: the model was exported before the SavedModel carried its id map.
    """
    if not hasattr(loaded, "item_ids") or SIGNATURE not in loaded.signatures:
        raise VaecfError(f"{where}: this SavedModel has no item id map (exported by an older "
                         "vaecf); train it again with this version")
    return np.array([i.decode() for i in loaded.item_ids.numpy().tolist()], dtype=object)


class ServedModel:
    """The ``recommend_ids`` signature of a trained model, loaded once."""

    def __init__(self, loaded: Any, where: str) -> None:
        self.item_ids = item_id_map(loaded, where)
        self.n_items = int(self.item_ids.size)
        encoded = np.array([i.encode() for i in self.item_ids], dtype=np.bytes_)
        self.id_bytes = int(encoded.itemsize)  # the longest id, in UTF-8
        self._loaded = loaded  # keeps the signature's variables alive
        self._signature = loaded.signatures[SIGNATURE]
        # The answer's ids are found in the sorted map rather than decoded (``_model_ids``);
        # numpy's fixed-width bytes drop trailing NULs, so ids that then collide keep decoding.
        self._order = np.argsort(encoded, kind="stable")
        self._sorted: np.ndarray | None = encoded[self._order]
        if np.unique(encoded).size != encoded.size:
            self._sorted = None

    @classmethod
    def load(cls, uri: str) -> ServedModel:
        """Load and verify a ``vaecf train`` output (local dir or s3://; checksums checked)."""
        import tensorflow as tf

        with open_input(uri) as local:
            read_manifest(local, "train", required=["saved_model/saved_model.pb"])
            return cls(tf.saved_model.load(str(local / "saved_model")), uri)

    def recommend(self, users: Sequence[Sequence[str] | np.ndarray], k: Sequence[int]
                  ) -> Ranking:
        """Top-k raw ids for each user of ``users`` (their items as raw ids: text, or UTF-8
        bytes arrays as ``vaecf.serve.protocol`` packs them), one model call.

        The ids go to TensorFlow as one fixed-width bytes array, not as Python strings.
        """
        import tensorflow as tf

        rows = [items if isinstance(items, np.ndarray)
                else np.array([i.encode() for i in items], dtype=np.bytes_) for items in users]
        width = max(1, max(row.size for row in rows))
        padded = np.zeros((len(rows), width), dtype=f"S{max(row.itemsize for row in rows)}")
        for index, row in enumerate(rows):
            padded[index, :row.size] = row
        out = self._signature(items=tf.constant(padded), k=tf.constant(np.asarray(k, np.int32)))
        return Ranking(item_ids=self._model_ids(out["item_id"].numpy().astype(np.bytes_)),
                       scores=out["scores"].numpy(), unknown=out["unknown"].numpy(),
                       fallback=out["fallback"].numpy())

    def _model_ids(self, answer: np.ndarray) -> np.ndarray:
        """The answer's ids (bytes [B, K], b"" past k) as object [B, K] of ``item_ids``' own
        strings ("" past k).

        Found by a sorted search, not decoded: the largest answer (1,024 x 1,000 places) then
        makes no new string per place, so it leaves no million small objects behind to
        fragment the heap; the answer's lists and JSON refer to the model's strings.
        """
        if self._sorted is None:
            return np.char.decode(answer, "utf-8").astype(object)
        position = np.searchsorted(self._sorted, answer).clip(max=self.n_items - 1)
        empty = answer == b""
        if not np.all(empty | (self._sorted[position] == answer)):
            raise ValueError("the model answered an id that is not in its own id map")
        return np.where(empty, "", self.item_ids[self._order[position]]).astype(object)
