"""``score_batch`` of a trained model: the ``score`` signature of its SavedModel.

The model directory is the output of ``vaecf train`` (contracts): ``saved_model/`` with a
``score(row_splits, item_idx) -> {"scores": float32 [B, n_items]}`` signature taking the users'
fold-in items as ragged rows (``row_splits`` int64 [B + 1], ``item_idx`` int64 [nnz]), and
``train_manifest.json`` with the model's ``n_items`` and the ``split_digest`` of the split it
was trained on (``vaecf.data.splits.split_digest``). A CSR chunk is already in that form:
``indptr`` is the row splits and ``indices`` the item_idx, so no dense input is ever built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from vaecf.baselines.popularity import Popularity
from vaecf.errors import VaecfError
from vaecf.io import read_manifest

SIGNATURE = "score"


def model_identity(model_dir: Path) -> tuple[int, str]:
    """``(n_items, split_digest)`` of the split the model was trained on, from its verified
    ``train_manifest.json``."""
    manifest = read_manifest(model_dir, "train", required=["saved_model/saved_model.pb"])
    value = manifest.get("n_items", manifest.get("counts", {}).get("n_items"))
    if not isinstance(value, int) or isinstance(value, bool):
        raise VaecfError(f"{model_dir}/train_manifest.json: no integer 'n_items' "
                         f"(got {value!r})")
    digest = manifest.get("split_digest")
    if not isinstance(digest, str):
        raise VaecfError(f"{model_dir}/train_manifest.json: no 'split_digest' naming the split "
                         "the model was trained on (retrain it with this version of vaecf)")
    return value, digest


class SavedModelScorer:
    """Scores users with a trained model's SavedModel.

    Args:
      model_dir: a local ``vaecf train`` output directory.
      n_items: the split's item count.
      split_digest: the split's identity. A model trained on another split is refused: its
        training users may be this split's test users, which would inflate every metric.
      train: the split's training matrix (users, n_items). The SavedModel carries what it
        was trained on (its popularity fallback: training users per item); it must be this
        split's, so a ``split_digest`` edited in ``train_manifest.json`` (which no checksum
        covers) is caught by what the model holds, not trusted.
    """

    def __init__(self, model_dir: Path, n_items: int, split_digest: str,
                 train: sp.csr_matrix | None = None) -> None:
        trained, trained_on = model_identity(model_dir)
        if trained != n_items:
            raise VaecfError(f"{model_dir}: the model was trained on {trained} items but the "
                             f"split has {n_items} (evaluate it on the split it was trained on)")
        if trained_on != split_digest:
            raise VaecfError(f"{model_dir}: the model was trained on another split (split "
                             f"digest {trained_on[:12]}, this split's {split_digest[:12]}); "
                             "evaluate it on the split it was trained on")
        import tensorflow as tf

        path = model_dir / "saved_model"
        try:
            self._model = tf.saved_model.load(str(path))
        except (OSError, ValueError, tf.errors.OpError) as err:
            raise VaecfError(f"{path}: cannot load the SavedModel ({err})") from err
        if SIGNATURE not in self._model.signatures:
            raise VaecfError(f"{path}: no '{SIGNATURE}' signature (has: "
                             f"{', '.join(self._model.signatures) or 'none'})")
        self._score = self._model.signatures[SIGNATURE]
        self.n_items = n_items
        if train is not None:
            self._check_trained_on(path, train)

    def _check_trained_on(self, path: Path, train: sp.csr_matrix) -> None:
        held = getattr(self._model, "popularity", None)
        ours = Popularity(train).counts  # as vaecf.train.export computed it
        if held is None or not np.array_equal(np.asarray(held.numpy()), ours):
            raise VaecfError(f"{path}: the model was trained on another split (its training "
                             "users per item are not this split's, whatever train_manifest"
                             ".json says); evaluate it on the split it was trained on")

    def __call__(self, rows: sp.csr_matrix) -> Any:
        """float32 tf.Tensor (B, n_items): the model's unmasked scores of these users."""
        import tensorflow as tf

        out = self._score(row_splits=tf.constant(rows.indptr.astype(np.int64)),
                          item_idx=tf.constant(rows.indices.astype(np.int64)))
        return out["scores"]
