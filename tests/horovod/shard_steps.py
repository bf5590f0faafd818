"""Run under ``horovodrun``: the same steps with and without ``--shard-items`` on each rank.

Both models start from the same weights (the sharded one from slices of the whole one) and
take the same batches (each rank its own users); rank 0 writes both runs' losses, both
models' logits of one batch (every rank scoring it) and the whole weights (shards gathered
row by row) to the .npz named by argv[1].
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

from vaecf.model import MultVAE, SparseBatch
from vaecf.train import horovod as dist
from vaecf.train.config import TrainConfig

N_ITEMS, USERS, STEPS = 37, 4, 4  # 40 padded items: rank 1 holds 16 + 8 beyond them


def batch(rng: np.random.Generator) -> SparseBatch:
    rows = np.repeat(np.arange(USERS), 5)
    return SparseBatch(tf.constant(rows, tf.int64), tf.constant(rng.integers(0, N_ITEMS, 20)),
                       tf.ones([20]), tf.constant(rng.integers(0, 1000, USERS)))


def shard_slices(whole: MultVAE, sharded: MultVAE) -> list[np.ndarray]:
    """The whole model's weights cut to this rank's item shard (zeros past its items)."""
    first, width = sharded.shard.first, sharded.shard.width
    own = {id(v) for v in sharded.sharded_variables()}
    out = []
    for ours, value in zip(sharded.weights, whole.get_weights(), strict=True):
        if id(ours) in own:
            axis = 1 if ours is sharded.decoder_out.kernel else 0
            columns = np.arange(first, first + width)
            value = np.take(value, columns, axis=axis, mode="clip")  # past the padded items:
            inside = (columns < whole.n_padded).reshape([-1] + [1] * (value.ndim - 1 - axis))
            value = np.where(inside, value, 0.0)
        out.append(value)
    return out


def train(model: MultVAE, config: TrainConfig, runtime: dist.Runtime) -> list[float]:
    optimizer = dist.make_optimizer(config)
    optimizer.build(model.trainable_variables)
    step = tf.function(dist.train_step(model, optimizer, config, runtime),  # the loop's step
                       reduce_retracing=True)
    rng = np.random.default_rng(runtime.rank)
    return [float(step(batch(rng), tf.constant(i, tf.int64))[0]) for i in range(STEPS)]


def main(path: str) -> None:
    config = TrainConfig(split="", output="", checkpoint_dir="", hidden=16, latent=4,
                         anneal_steps=3, l2=0.01, batch_size=2 * USERS)
    runtime = dist.start(config)
    whole = MultVAE(N_ITEMS, hidden=16, latent=4, seed=3)
    whole.build_variables()
    sharded = MultVAE(N_ITEMS, hidden=16, latent=4, seed=3, item_chunk=8,
                      shard=dist.item_shard(runtime, whole.n_padded))
    sharded.build_variables()
    sharded.set_weights(shard_slices(whole, sharded))
    results = {"whole_losses": train(whole, config, runtime),
               "shard_losses": train(sharded, config, runtime)}
    # inference: every rank scores the same users and gets every item's logits
    users = batch(np.random.default_rng(99))
    results["shard_logits"] = sharded(users)[0].numpy()[:, :whole.n_padded]
    results["whole_logits"] = whole(users)[0].numpy()
    dist.GATHER_BLOCK_BYTES = 64  # a row of each rank per block: the blocks' order is tested
    gathered = dist.whole_weights(sharded, sharded.get_weights(), runtime)
    if gathered is not None:
        for i, (ours, theirs) in enumerate(zip(gathered, whole.get_weights(), strict=True)):
            results[f"shard/{i}"], results[f"whole/{i}"] = ours, theirs
        np.savez(path, **results)


if __name__ == "__main__":
    main(sys.argv[1])
