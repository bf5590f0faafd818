"""The model's input type, below every module of ``vaecf.model`` that takes a batch (the
layers, the losses, the item shards and the model), so none of them imports another for it."""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf


class SparseBatch(NamedTuple):
    """A batch of users' items in coordinate form (padding entries have value 0).

    Attributes:
      rows: int64 [nnz], row of each entry in the batch (0..users-1).
      item_idx: int64 [nnz], contiguous item index of each entry.
      values: float32 [nnz], the entry (1 for an implicit positive, 0 for padding).
      user_idx: int64 [users], global user index of each row (keys the random noise).
    """

    rows: tf.Tensor
    item_idx: tf.Tensor
    values: tf.Tensor
    user_idx: tf.Tensor
