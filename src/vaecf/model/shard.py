"""Item sharding: the two item-sized layers split by items over the ranks of a job.

Rank ``r`` of ``W`` owns items ``r * width .. (r + 1) * width`` (``width`` the padded items
divided by ``W``, rounded up to a multiple of 8): those rows of the encoder's first layer
and those columns (and biases) of the decoder, with their Adam moments. The small middle
layers stay data-parallel. Per step (Megatron-LM's vocabulary-parallel cross-entropy, with
the first layer sharded the same way by rows):

- the batch's entries are allgathered; each rank sums the first-layer rows it owns for every
  user of the global batch and the partial sums are allreduced (each rank keeps its users);
- the decoder's last activations of the global batch are allgathered; each rank computes its
  items' logits by chunk (``loss.chunked_statistics``), and the per-shard max, sum of exp and
  the users' own-item logits are combined by allreduce into the exact log-sum-exp;
- backward, the upstream gradient of every user is allgathered and the activations' gradient
  allreduced, so each rank's item-sized gradient is already the sum over all ranks' losses:
  it is never allreduced.

The collectives are passed in (``Collectives``), so the model never imports Horovod.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import tensorflow as tf

from vaecf.model import loss


class Collectives(NamedTuple):
    """The job's collectives over float32 tensors, in rank order."""

    allgather: Callable[[tf.Tensor], tf.Tensor]  # concatenation on axis 0
    allreduce_sum: Callable[[tf.Tensor], tf.Tensor]
    allreduce_max: Callable[[tf.Tensor], tf.Tensor]


@dataclass(frozen=True)
class ItemShard:
    """This rank's share of the items.

    Attributes:
      rank, size: this process's rank and the world size.
      width: items per rank (the last rank's share may end in padding).
      collectives: Horovod's (``vaecf.train.horovod.collectives``).
    """

    rank: int
    size: int
    width: int
    collectives: Collectives

    @property
    def first(self) -> int:
        """Global index of this rank's first item."""
        return self.rank * self.width

    def own(self, everyone: tf.Tensor, users: tf.Tensor) -> tf.Tensor:
        """This rank's rows of a [size * users, ...] tensor of the global batch."""
        return everyone[self.rank * users:(self.rank + 1) * users]


def shard_width(n_padded: int, size: int) -> int:
    """Items per rank: ``n_padded / size`` rounded up to a multiple of 8."""
    return -(-n_padded // (8 * size)) * 8


def global_entries(rows: tf.Tensor, item_idx: tf.Tensor, values: tf.Tensor, users: tf.Tensor,
                   shard: ItemShard) -> loss.Entries:
    """Every rank's batch entries, rows numbered in the global batch (rank-major, each rank
    ``users`` rows) and items relative to this rank's first item."""
    offset = tf.cast(shard.rank, tf.int64) * tf.cast(users, tf.int64)
    gather = shard.collectives.allgather
    return loss.Entries(tf.cast(gather(rows + offset), tf.int32),
                        gather(item_idx) - shard.first, gather(values))


def first_layer(entries: loss.Entries, kernel: tf.Tensor, users: tf.Tensor,
                shard: ItemShard) -> tf.Tensor:
    """float32 [users, hidden]: this rank's users' ``x @ kernel`` over all items' rows.

    Args:
      entries: the global batch (``global_entries``), values normalised (and dropped out).
      kernel: float32 [width, hidden], this rank's rows.
      users: users per rank.
    """
    local, weight = _owned(entries, shard)
    everyone = users * shard.size

    @tf.custom_gradient
    def product(kernel: tf.Tensor) -> tuple[tf.Tensor, Callable[[tf.Tensor], tf.Tensor]]:
        mine = shard.own(shared_first_layer(entries, kernel, everyone, shard), users)

        def grad(upstream: tf.Tensor) -> tf.Tensor:
            upstream = shard.collectives.allgather(upstream)  # every user's, every rank's
            return tf.math.unsorted_segment_sum(tf.gather(upstream, entries.rows) * weight,
                                                local, shard.width)

        return mine, grad

    return product(kernel)


def _owned(entries: loss.Entries, shard: ItemShard) -> tuple[tf.Tensor, tf.Tensor]:
    """(row in this rank's kernel [nnz], the value where the item is this rank's else 0
    [nnz, 1]) of ``entries`` (items relative to this rank's first item)."""
    inside = (entries.items >= 0) & (entries.items < shard.width)
    local = tf.clip_by_value(entries.items, 0, shard.width - 1)
    return local, tf.where(inside, entries.values, 0.0)[:, tf.newaxis]


def shared_first_layer(entries: loss.Entries, kernel: tf.Tensor, users: tf.Tensor,
                       shard: ItemShard) -> tf.Tensor:
    """float32 [users, hidden]: ``x @ kernel`` of a batch every rank holds alike (inference:
    validation on every rank); each rank sums the rows it owns, the sums are allreduced.

    Args:
      entries: the batch's entries, items relative to this rank's first item.
      kernel: float32 [width, hidden], this rank's rows.
    """
    local, weight = _owned(entries, shard)
    partial = tf.math.unsorted_segment_sum(tf.gather(kernel, local) * weight, entries.rows,
                                           users)
    return shard.collectives.allreduce_sum(partial)


def all_items(logits: tf.Tensor, shard: ItemShard) -> tf.Tensor:
    """[users, size * width]: every rank's item columns of ``logits`` [users, width], in
    item order (a collective: the whole catalogue's scores of a batch every rank holds)."""
    return tf.transpose(shard.collectives.allgather(tf.transpose(logits)))


def nll(hidden: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor, entries: loss.Entries,
        chunk: int, shard: ItemShard) -> tf.Tensor:
    """Per-user multinomial NLL, float32 [users], of this rank's users over all items.

    Args:
      hidden: [users, hidden] decoder activations of this rank's users (compute dtype).
      kernel: [hidden, width], bias: float32 [width]: this rank's decoder columns.
      entries: the global batch (``global_entries``).
      chunk: items per chunk of this rank's logits.
    """
    users = tf.shape(hidden)[0]
    count = tf.math.unsorted_segment_sum(entries.values, entries.rows, users * shard.size)
    reduce_sum = shard.collectives.allreduce_sum

    @tf.custom_gradient
    def likelihood(hidden: tf.Tensor, kernel: tf.Tensor,
                   bias: tf.Tensor) -> tuple[tf.Tensor, Callable[[tf.Tensor], tuple]]:
        everyone = shard.collectives.allgather(hidden)
        top, total, dot = loss.chunked_statistics(everyone, kernel, bias, entries, chunk)
        top_all = shard.collectives.allreduce_max(top)
        lse = top_all + tf.math.log(reduce_sum(total * tf.exp(top - top_all)))
        value = count * lse - reduce_sum(dot)

        def grad(upstream: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            upstream = shard.collectives.allgather(upstream)
            d_hidden, d_kernel, d_bias = loss.chunked_gradients(
                everyone, kernel, bias, lse, upstream * count, entries, upstream, chunk)
            d_hidden = reduce_sum(tf.cast(d_hidden, tf.float32))
            return tf.cast(shard.own(d_hidden, users), hidden.dtype), d_kernel, d_bias

        return shard.own(value, users), grad

    return likelihood(hidden, kernel, bias)


def penalty(kernels: list[tf.Tensor], l2: float, shard: ItemShard) -> tf.Tensor:
    """``l2 * sum ||W||^2`` over the sharded kernels of every rank (the whole model's).

    Its gradient through the allreduce is ``size`` times this rank's share, which the step's
    division of sharded gradients by ``size`` (the average over ranks) cancels.
    """
    if l2 == 0.0:
        return tf.constant(0.0, tf.float32)
    return shard.collectives.allreduce_sum(loss.l2_penalty(kernels, l2))
