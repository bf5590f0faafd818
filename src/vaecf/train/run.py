"""``train(config)``: the whole of ``vaecf train`` -- data in, trained model directory out.

Every rank reads the split and trains; rank 0 alone publishes the output directory
(``saved_model/``, ``item_index.parquet`` copied from the split so that ``vaecf recommend``
can map raw item ids, ``train_log.jsonl``, ``train_manifest.json``), atomically, and only once
training has finished: a failed or killed run leaves the output absent, its checkpoints kept.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import keras
import numpy as np

from vaecf import log
from vaecf.baselines import Popularity
from vaecf.data.splits import Split, open_split
from vaecf.errors import VaecfError
from vaecf.io import manifest_name, publish, write_manifest
from vaecf.train import ease_blend
from vaecf.train import horovod as dist
from vaecf.train.config import TrainConfig
from vaecf.train.export import save, serving_module
from vaecf.train.trainer import Trainer, user_shares


def train(config: TrainConfig) -> None:
    """Train Mult-VAE on ``config.split`` and publish the best epoch's model (rank 0)."""
    started = time.monotonic()
    previous_policy = keras.mixed_precision.global_policy()
    runtime = dist.start(config)
    try:
        with contextlib.ExitStack() as stack:
            shares = user_shares(config, runtime)
            # each rank reads (and from s3://, downloads) only its share of the training
            # users (one process: all)
            split = stack.enter_context(open_split(config.split, train_share=(
                runtime.rank, shares) if shares == runtime.size else (0, 1)))
            config = fit_batch(config, split.n_train_users, runtime.size)
            loaded = dist.gather_object(_loaded(split), runtime)
            log.info(f"training on {split.n_train_users:,} users x {split.n_items:,} items, "
                     f"world size {runtime.size}, {config.precision}, "
                     f"batch {config.batch_size}; training pairs held by each rank: "
                     + ", ".join(f"{share['pairs']:,} (users {share['users'][0]:,} to "
                                 f"{share['users'][1] - 1:,})" for share in loaded))
            # The model's size is checked (``Trainer``) before the output is locked or staged:
            # a model too large for this machine leaves nothing behind.
            trainer = Trainer(config, runtime, split.train, split.heldout("val"),
                              split_digest=split.digest, first=split.train_first,
                              n_users=split.n_train_users, nnz=split.n_train_pairs)
            staging = (stack.enter_context(publish(config.output, manifest_name("train"),
                                                    config.inputs))
                       if runtime.is_chief else None)
            stack.callback(trainer.tracker.close)
            # rank 0 decides for all (the memory each rank sees differs): every rank or none
            # adds its share to EASE's Gram matrix
            ease_off = dist.broadcast_object(ease_blend.why_off(config, split.n_items), runtime)
            if ease_off and config.ease_blend != "off":
                log.info(f"EASE is not blended into the exported scores: {ease_off}")
            trainer.restore()
            trainer.fit()
            gram = (None if ease_off else
                    ease_blend.item_gram(split.train, runtime, summed=shares == runtime.size))
            digests = dist.gather_object(trainer.weights_digest(), runtime)
            best = dist.whole_weights(trainer.model, trainer.state.best_weights, runtime)
            popularity = Popularity(split.train).counts  # users per item, summed over shares
            if shares == runtime.size:
                popularity = dist.allreduce_sum(popularity.astype(np.float64), runtime)
            if staging is not None:
                if len(set(digests)) != 1:
                    raise VaecfError(f"the {runtime.size} ranks ended with different weights "
                                     f"(digests {digests}): replicas diverged")
                split.write_item_index(staging / "item_index.parquet")
                _write_output(staging, trainer, best, split, popularity, loaded, digests,
                              config, started, (gram, ease_off))
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)


def fit_batch(config: TrainConfig, train_users: int, world_size: int) -> TrainConfig:
    """Refuse a chosen global batch larger than the training users, before anything is
    allocated (each step would hold every user several times; a huge one exhausts memory).

    The default batch was never chosen, so on a smaller split it becomes the training users
    (rounded down to a multiple of the world size), and the log says so.
    """
    if config.batch_size <= train_users:
        return config
    fitted = train_users - train_users % world_size
    if not config.batch_size_default or fitted < 1:
        raise VaecfError(f"--batch-size {config.batch_size}: larger than the {train_users:,} "
                         f"training users of {config.split} (use at most {train_users})")
    log.info(f"batch {fitted}: the default --batch-size {config.batch_size} is larger than "
             f"the {train_users:,} training users of {config.split}")
    return replace(config, batch_size=fitted)


def _loaded(split: Split) -> dict[str, Any]:
    """What this rank loaded of the training matrix: its users, their pairs, and the rows
    it read from disk to find them (whole row groups)."""
    return {"users": [split.train_first, split.train_first + split.train.shape[0]],
            "pairs": int(split.train.nnz), "pairs_read": split.train_rows_read}


def _write_output(staging: Path, trainer: Trainer, best_weights: list[np.ndarray] | None,
                  split: Split, popularity: np.ndarray, loaded: list[dict[str, Any]],
                  digests: list[str], config: TrainConfig, started: float,
                  ease: tuple[np.ndarray | None, str | None]) -> None:
    """Export the best epoch (with EASE blended in where ``ease``'s Gram matrix is given and
    the validation users choose it) and write the model's manifest and log."""
    state = trainer.state
    if best_weights is None:
        raise VaecfError("no epoch was validated: nothing to export")
    shapes = {"n_items": trainer.n_items, "hidden": config.hidden, "latent": config.latent,
              "encoder_layers": config.encoder_layers, "item_ids": split.item_ids,
              "popularity": popularity}
    weights = trainer.exported_weights(best_weights)
    module = serving_module(weights, **shapes)
    best = next(r for r in state.log if r["epoch"] == state.best_epoch)
    gram, off = ease
    blended: dict[str, Any] = {"off": off}
    if gram is not None:
        chosen, blended = ease_blend.choose(module, gram, config.ease_lambda,
                                            *split.heldout("val"))
        if chosen is not None:
            module = serving_module(weights, **shapes, ease=chosen)
    save(module, staging / "saved_model")
    with open(staging / "train_log.jsonl", "w") as handle:
        for record in state.log:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
    write_manifest(
        staging, "train", inputs={"split": config.split},
        parameters=trainer.config.parameters(),  # with anneal_steps as resolved for the run
        counts={"train_users": trainer.n_users, "epochs": state.epoch,
                "steps": state.step, "train_share": loaded},
        started=started,
        extra={"n_items": trainer.n_items, "split_n_items": split.n_items,
               "split_digest": split.digest,
               # best_val: the model alone at its best epoch; ease_blend's val: exported
               "best_epoch": state.best_epoch, "best_val": best["val"], "ease_blend": blended,
               # without --epochs: whether the patience ran out before --max-epochs
               "stopped_early": state.epoch < config.epoch_cap,
               "best_val_stderr": best.get("val_stderr"),
               "world_size": trainer.runtime.size, "hosts": trainer.runtime.hosts,
               "replica_weight_sha256": digests})
    log.info(f"best epoch {state.best_epoch} (val ndcg@100 {state.best_ndcg:.4f}) exported "
             f"to {config.output}")
