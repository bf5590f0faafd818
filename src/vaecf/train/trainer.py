"""The training loop: epochs of data-parallel steps, validation, checkpoints, the best weights.

Rank 0 alone validates, checkpoints and keeps the best weights; the other ranks only step.
With item shards (``--shard-items``) every rank validates (a collective), checkpoints and
keeps the best weights of its own shard.
State that must survive a restart is exactly what ``checkpoint`` stores, so a resumed run
continues the same trajectory: the permutations of each epoch are a function of (seed,
epoch, pass, rank) over each rank's share of the users (``data.all_ranks_users``; the same
shares again on the same number of processes, or ``--user-shares``) and the model's noise a
function of (seed, step, user), both recorded in the checkpoint.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import tensorflow as tf

from vaecf import log
from vaecf.errors import VaecfError
from vaecf.io.bounds import STEPS_PER_CALL
from vaecf.metrics import evaluate
from vaecf.model import MultVAE, choose_item_chunk, padded_items
from vaecf.model import implicit_slim as slim
from vaecf.train import calls, checkpoint, data, memory
from vaecf.train import horovod as dist
from vaecf.train.config import STATE_PARAMETERS, TrainConfig
from vaecf.train.tracking import VAL_KEYS, EpochTracker


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def read_back(values: tf.Tensor) -> np.ndarray:
    """The one place the training loop waits for the device: ``values`` as numpy."""
    return np.asarray(values.numpy())


@dataclass
class State:
    """Where training stands: completed epochs, global step, the log, the best epoch."""

    epoch: int = 0
    step: int = 0
    log: list[dict[str, Any]] = field(default_factory=list)
    best_epoch: int | None = None
    best_ndcg: float = -1.0
    best_weights: list[np.ndarray] | None = None


class Trainer:
    """Trains a ``MultVAE`` on ``train`` (CSR [users, items]) and validates on ``val``.

    ``train`` holds the rows of this rank's training users (``data.user_share``; every
    user's in one process): row r is user ``first + r`` of the ``n_users`` training users,
    whose matrix has ``nnz`` entries in all.

    ``split_digest`` (``vaecf.data.splits.split_digest``) goes into every checkpoint: a
    checkpoint of another split is never resumed, or the model would claim a split it was
    not (only) trained on.
    """

    def __init__(self, config: TrainConfig, runtime: dist.Runtime, train: sp.csr_matrix,
                 val: tuple[sp.csr_matrix, sp.csr_matrix], *, split_digest: str,
                 first: int = 0, n_users: int | None = None, nnz: int | None = None) -> None:
        self.n_users = train.shape[0] if n_users is None else n_users
        self.first = first
        self.shares = user_shares(config, runtime)
        if config.batch_size % self.shares:
            raise VaecfError(f"--batch-size {config.batch_size}: not a multiple of the "
                             f"{self.shares} user shares")
        self.steps = data.steps_per_epoch(self.n_users, config.batch_size,
                                          config.steps_per_epoch)
        config = config.resolved(self.steps)  # recorded in checkpoints and the manifest
        self.config, self.runtime, self.train, self.val = config, runtime, train, val
        self.split_digest = split_digest
        self.n_items = train.shape[1]
        local = config.batch_size // runtime.size
        shard = dist.item_shard(runtime, padded_items(self.n_items)) if config.shard_items \
            else None
        users = local * runtime.size if shard else local  # rows of one step's logits
        device = data.resident_device()
        chunk = choose_item_chunk(users, shard.width if shard else padded_items(self.n_items),
                                  config.item_chunk, "GPU" if device else "CPU")
        memory.check_fits(shard.width if shard else self.n_items, config.hidden, config.latent,
                          users, chunk, encoder_layers=config.encoder_layers,
                          composite_prior=config.composite_prior)
        self.model = MultVAE(self.n_items, hidden=config.hidden, latent=config.latent,
                             dropout=config.dropout, policy=config.keras_policy,
                             seed=config.seed, xla=config.xla, item_chunk=chunk, shard=shard,
                             encoder_layers=config.encoder_layers,
                             composite_prior=config.composite_prior)
        # Sharded: every rank writes and reads its own shard's checkpoints.
        self.checkpoint_dir = (config.checkpoint_dir if shard is None
                               else f"{config.checkpoint_dir.rstrip('/')}/shard-{runtime.rank}")
        if chunk is not None:
            log.info(f"likelihood over chunks of {chunk:,} items ({self.n_items:,} items)")
        self.model.build_variables()
        self.optimizer = dist.make_optimizer(config)
        self.optimizer.build(self.model.trainable_variables)
        one_size = config.xla or config.shard_items
        lengths = None
        if one_size:  # every rank sizes every rank's batches: each one's row lengths
            own = np.diff(train.indptr).astype(np.int64)
            lengths = np.concatenate(dist.gather_object(own, runtime))
        granule = data.pad_granule(train.nnz if nnz is None else nnz, self.n_users, local)
        self.maker = data.BatchMaker(train, granule, device=device, one_size=one_size,
                                     first=first, lengths=lengths)
        # One call of many steps per phase of the epoch's passes (only "joint" unless
        # --alternate): its batches gathered inside, where the matrix lives.
        limit = min(STEPS_PER_CALL, self.steps)
        self.whole = dist.compiles_whole(config, runtime)
        self.calls = {phase: calls.make_train_call(
            dist.train_step(self.model, self.optimizer, config, runtime, phase),
            self.maker.gather, limit=limit, jit_compile=self.whole)
            for phase in dict.fromkeys(config.passes)}
        self.sizer = calls.CallSizer(config.steps_per_call, limit)
        self.clock = calls.CallClock()
        self.state = State()
        self.tracker = EpochTracker(config.tensorboard_dir)  # used on rank 0 only
        self._scores = tf.function(self._score_batch, reduce_retracing=True)

    # ---- resume and checkpoints (rank 0 reads and writes; the others get a broadcast)

    def restore(self) -> None:
        """Resume from the newest valid checkpoint, if any, on every rank."""
        found = None
        if self.runtime.is_chief or self.model.shard is not None:
            found = checkpoint.load_newest(self.checkpoint_dir)
            self._check_shards(found)
            if found is not None:
                self._check_compatible(found)
                self._apply(found)
                log.info(f"resuming from checkpoint {found.name} (epoch {self.state.epoch}, "
                         f"step {self.state.step})")
        self.state.epoch, self.state.step = dist.broadcast_object(
            (self.state.epoch, self.state.step), self.runtime)
        dist.broadcast_state(self.model, self.optimizer, self.runtime)

    def _check_shards(self, found: checkpoint.Checkpoint | None) -> None:
        """Sharded: every rank found its shard of one checkpoint, written by as many ranks."""
        if self.model.shard is None:
            return
        ours = (found.name, found.meta.get("world_size")) if found else (None, None)
        names = dist.gather_object(ours, self.runtime)
        sizes = {size for _, size in names if size is not None}
        if sizes - {self.runtime.size}:
            raise VaecfError(f"{self.config.checkpoint_dir}: shards written by {sizes.pop()} "
                             f"process(es), this job has {self.runtime.size} (--shard-items "
                             "resumes on the same world size; use another --checkpoint-dir)")
        if len(set(names)) != 1:
            raise VaecfError(f"{self.config.checkpoint_dir}: the ranks' newest shards differ "
                             f"({[name for name, _ in names]}); use another --checkpoint-dir")

    def _check_compatible(self, found: checkpoint.Checkpoint) -> None:
        saved = found.meta.get("parameters", {})
        if found.meta.get("split_digest") != self.split_digest:
            raise VaecfError(f"{self.checkpoint_dir}/{found.name}: written for another "
                             f"split (split digest {str(found.meta.get('split_digest'))[:12]}, "
                             f"this split's {self.split_digest[:12]}; use another "
                             "--checkpoint-dir to start afresh)")
        if found.meta.get("n_items") != self.n_items:
            raise VaecfError(f"{self.checkpoint_dir}/{found.name}: written for "
                             f"{found.meta.get('n_items')} items, the split has {self.n_items}")
        for key in STATE_PARAMETERS:
            ours = self.config.parameters()[key]
            if saved.get(key) != ours:
                flag = "--" + key.replace("_", "-")
                raise VaecfError(f"{self.checkpoint_dir}/{found.name}: written with "
                                 f"{flag} {saved.get(key)}, this run has {ours} (use another "
                                 "--checkpoint-dir to start afresh)")

    def _apply(self, found: checkpoint.Checkpoint) -> None:
        arrays, meta = found.arrays, found.meta
        self.model.set_weights([arrays[f"model/{i}"] for i in range(len(self.model.weights))])
        for i, variable in enumerate(self.optimizer.variables):
            variable.assign(arrays[f"optimizer/{i}"])
        inner = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        inner.learning_rate.assign(self.config.learning_rate)  # a resumed run may change it
        n_best = sum(key.startswith("best/") for key in arrays)
        best = [arrays[f"best/{i}"] for i in range(n_best)] or None
        self.state = State(epoch=int(meta["epoch"]), step=int(meta["step"]), log=meta["log"],
                           best_epoch=meta["best_epoch"], best_ndcg=float(meta["best_ndcg"]),
                           best_weights=best)

    def save_checkpoint(self) -> None:
        s = self.state
        arrays = {f"model/{i}": w for i, w in enumerate(self.model.get_weights())}
        arrays.update({f"optimizer/{i}": np.asarray(v.numpy())
                       for i, v in enumerate(self.optimizer.variables)})
        arrays.update({f"best/{i}": w for i, w in enumerate(s.best_weights or [])})
        meta = {"step": s.step, "log": s.log, "best_epoch": s.best_epoch,
                "best_ndcg": s.best_ndcg, "n_items": self.n_items,
                "split_digest": self.split_digest, "world_size": self.runtime.size,
                "parameters": self.config.parameters(), "loss_scale": self.loss_scale(),
                "rng": {"noise": {"seed": self.config.seed, "counter": s.step},
                        "shard": {"seed": self.config.seed, "next_epoch": s.epoch + 1}}}
        name = checkpoint.save(self.checkpoint_dir, s.epoch, meta, arrays)
        log.info(f"checkpoint {self.checkpoint_dir}/{name} written")

    def loss_scale(self) -> float | None:
        scale = getattr(self.optimizer, "dynamic_scale", None)
        return None if scale is None else float(scale.numpy())

    # ---- the loop

    def fit(self) -> None:
        """Train from the current state to ``config.epochs``, or until the validation
        NDCG@100 has not improved for ``config.patience`` epochs (at most
        ``config.max_epochs``) when ``config.epochs`` is None.

        A SIGTERM (Kubernetes stopping the pod) or SIGINT (Ctrl-C) ends the run after the
        current epoch, with a checkpoint (rank 0's, or every rank's shard with
        ``--shard-items``), so a rerun resumes there; a second signal acts at once.
        """
        with checkpoint.stop_request() as stop:
            self._fit(stop)

    def _fit(self, stop: checkpoint.StopRequest) -> None:
        first, saved = True, time.monotonic()
        last = self.config.epoch_cap
        if self._patience_spent(self.state.epoch):  # a resumed run that had stopped
            return
        # Stopping is decided at validated epochs only (``stopping`` below): with
        # --validate-every N, never after an epoch whose score nobody saw.
        for epoch in range(self.state.epoch + 1, last + 1):
            with log.summarised():  # in a log, the epoch's one line is ``_describe``
                record = self._run_epoch(epoch, broadcast_after_first=first)
                first = False
                self.state.epoch = epoch
                validate = epoch % self.config.validate_every == 0 or epoch == last
                if validate and (self.runtime.is_chief or self.model.shard is not None):
                    record["val"], record["val_stderr"] = self._validate(epoch)
                if self.runtime.is_chief:
                    self.state.log.append(record)
                    log.info(_describe(record))
                    self.tracker.epoch_end(record)
            # The flag is read once: a signal arriving after this read stops the next epoch,
            # never this one without its checkpoint. One gather settles both decisions on every
            # rank: all stop after the same epoch, and rank 0's clock says whether a checkpoint
            # is due (sharded, every rank writes its shard or none does).
            signalled = [stop.signal_name] if stop.is_set() else []
            stopping = validate and self._patience_spent(epoch)
            due = bool(signalled) or stopping or self._checkpoint_due(epoch, saved)
            views = dist.gather_object((signalled, due), self.runtime)
            signalled = sorted({name for names, _ in views for name in names})
            due = bool(signalled) or views[0][1]
            if due and self.model.shard is not None:  # its checkpoint holds rank 0's log
                self.state.log = dist.broadcast_object(self.state.log, self.runtime)
            if due and (self.runtime.is_chief or self.model.shard is not None):
                self.save_checkpoint()
                saved = time.monotonic()
            if signalled:
                raise VaecfError(f"stopped by {' and '.join(signalled)} after epoch {epoch} "
                                 f"(step {self.state.step}); rerun to resume from its "
                                 "checkpoint")
            if stopping:
                break

    def _patience_spent(self, epoch: int) -> bool:
        """Early stopping, decided alike on every rank: rank 0's best epoch (rank 0 alone
        validates unless items are sharded) is broadcast, then ``TrainConfig.patience_spent``.
        Logs the stop once, on rank 0."""
        if self.config.epochs is not None or epoch == 0:
            return False
        best = self.state.best_epoch
        if self.model.shard is None:
            best = dist.broadcast_object(best, self.runtime)
        spent = self.config.patience_spent(epoch, best)
        if spent and best is not None and self.runtime.is_chief:
            log.info(f"early stop after epoch {epoch}: validation ndcg@100 has not improved "
                     f"for {epoch - best} epochs (--patience {self.config.patience}); best "
                     f"epoch {best}")
        return spent

    def _checkpoint_due(self, epoch: int, saved: float) -> bool:
        """The last epoch, every ``checkpoint_every`` epochs, or the interval has passed."""
        every = self.config.checkpoint_every
        return (epoch == self.config.epoch_cap or (every is not None and epoch % every == 0)
                or time.monotonic() - saved >= self.config.checkpoint_interval)

    def _run_epoch(self, epoch: int, broadcast_after_first: bool) -> dict[str, Any]:
        """One epoch: ``config.passes`` passes over the training users (one joint pass, or
        ``--alternate``'s encoder passes then a decoder pass), the composite prior's frozen
        encoder updated after the encoder's last update, ImplicitSLIM's step before it."""
        config, runtime = self.config, self.runtime
        closed_form = time.perf_counter()
        every = config.implicit_slim_every
        if every and epoch % every == 0:
            self._implicit_slim()
        closed_form = time.perf_counter() - closed_form  # part of the epoch's time
        waited = 0.0
        results: list[np.ndarray] = []
        pending: tuple[tf.Tensor, int, int] | None = None
        progress = log.Progress(f"epoch {epoch}", total=self.steps * len(config.passes),
                                unit="steps")
        started = time.perf_counter() - closed_form
        for index, phase in enumerate(config.passes):
            # The host's input work (the input share): the pass's permutation, placed; the
            # batches themselves are gathered inside the calls, on the device.
            before = time.perf_counter()
            users, padded = self._pass_inputs(epoch, index)
            waited += time.perf_counter() - before
            if phase == "decoder":  # RecVAE: the prior follows the encoder passes
                self.model.update_prior()
            self.sizer.measure(self._agreed(self.clock.take()))
            done = 0
            while done < self.steps:
                count = 1 if broadcast_after_first else self.sizer.steps(self.steps - done)
                out = self.calls[phase](users, padded, tf.constant(done, tf.int64),
                                        tf.constant(count, tf.int64),
                                        tf.constant(self.state.step, tf.int64))
                if pending is not None:  # read after queueing the next call: device works
                    results.append(self._check(*pending, epoch))
                    self.clock.read(pending[1])
                pending = (out, count, self.state.step)
                self.state.step += count
                done += count
                if broadcast_after_first:
                    dist.broadcast_state(self.model, self.optimizer, runtime)
                    broadcast_after_first = False
                progress.update(count)
        if config.passes == ("joint",):
            self.model.update_prior()
        assert pending is not None
        results.append(self._check(*pending, epoch))
        self.clock.read(pending[1])
        seconds = time.perf_counter() - started
        progress.close()
        stats = np.concatenate(results)
        loss, nll, kl, _, _ = stats.mean(axis=0)
        return {"epoch": epoch, "step": self.state.step, "loss": float(loss),
                "nll": float(nll), "kl": float(kl), "beta": float(stats[-1, 3]),
                "epoch_seconds": seconds,
                "users_per_second": self.steps * len(config.passes) * config.batch_size / seconds,
                "input_seconds": waited, "input_share": waited / seconds,
                "skipped_steps": int(stats[:, 4].sum()), "loss_scale": self.loss_scale(),
                "precision": config.precision, "world_size": runtime.size,
                "batch_size": config.batch_size, "shard_items": config.shard_items,
                "peak_rss_bytes": dist.gather_object(peak_rss_bytes(), runtime)}

    def _pass_inputs(self, epoch: int, index: int) -> tuple[tf.Tensor, tf.Tensor | int]:
        """Pass ``index`` of ``epoch``: this rank's users of each step, placed where the
        matrix lives, and each step's padded entries (``data.call_inputs``)."""
        config, runtime = self.config, self.runtime
        everyone = data.all_ranks_users(self.n_users, seed=config.seed, epoch=epoch,
                                        steps=self.steps, batch_size=config.batch_size,
                                        world_size=self.shares, pass_index=index)
        if self.shares != runtime.size:  # one process: every share's part of each step
            everyone = everyone.reshape(self.steps, 1, config.batch_size)
        return data.call_inputs(self.maker, everyone[:, runtime.rank],
                                self.maker.padded_sizes(everyone, runtime.rank),
                                static=self.whole)

    def _agreed(self, seconds_per_step: float | None) -> float | None:
        """Rank 0's measured speed on every rank (when the steps per call are chosen): the
        ranks cut their passes into the same calls."""
        if self.config.steps_per_call:
            return None
        return dist.broadcast_object(seconds_per_step, self.runtime)

    def _implicit_slim(self) -> None:
        """Set both item embeddings from ImplicitSLIM's closed form of the training matrix.

        Every rank computes it from its share of the users (its sums over users added over
        the ranks; on its own items under ``--shard-items``, the sums over items allreduced
        too); replicas then take rank 0's result, so they never drift apart.
        """
        config, shard, runtime = self.config, self.model.shard, self.runtime

        def sum_over_ranks(partial: np.ndarray) -> np.ndarray:
            return dist.allreduce_sum(partial, runtime)

        reduce_items: slim.ReduceSum = slim.alone
        if shard is None:
            shards, mine = [slice(0, self.model.n_padded)], 0
        else:
            shards = [slice(s * shard.width, (s + 1) * shard.width) for s in range(shard.size)]
            mine, reduce_items = shard.rank, sum_over_ranks
        padding = sp.csr_matrix((self.train.shape[0], shards[-1].stop - self.n_items),
                                dtype=self.train.dtype)
        counts, cooccur = slim.products(
            sp.hstack([self.train, padding], format="csr"), shards, mine, sum_over_ranks,
            lambda value, root: dist.broadcast_array(value, root, runtime))
        for variable, item_axis in self.model.item_embeddings():
            w = variable.numpy().T if item_axis == 0 else variable.numpy()
            new = slim.embeddings(w, counts, cooccur, config.implicit_slim_lambda,
                                  config.implicit_slim_alpha, config.implicit_slim_threshold,
                                  reduce_items)
            variable.assign(new.T if item_axis == 0 else new)
        if shard is None:
            dist.broadcast_state(self.model, self.optimizer, self.runtime)

    def _check(self, out: tf.Tensor, count: int, first_step: int, epoch: int) -> np.ndarray:
        """The statistics [count, 5] of one call (``count`` steps from the run's step
        ``first_step``, 0-based), refused if a loss is not finite: the run stops without a
        checkpoint, so the last good one is kept."""
        stats = read_back(out)[:count]
        bad = np.flatnonzero(~np.isfinite(stats[:, 0]))
        if bad.size:
            step = first_step + int(bad[0]) + 1
            raise VaecfError(f"non-finite loss at epoch {epoch} step {step} (seen at step "
                             f"{self.state.step}: results are read once per call, this one "
                             f"of {count} step{'s' if count > 1 else ''})")
        return stats

    def _validate(self, epoch: int) -> tuple[dict[str, float], dict[str, float]]:
        """Validation metrics of the current weights and their standard errors (what tells
        trials apart, ``vaecf tune``); remembers the best epoch's weights.

        Item shards: every rank scores the same users (each rank's items, gathered), so no
        rank ever holds the whole model; each keeps its own shard of the best weights.
        """
        result = evaluate(lambda rows: self._scores(data.csr_batch(rows)), *self.val)
        metrics = {key: result.metrics[key].mean for key in VAL_KEYS}
        errors = {key: result.metrics[key].stderr for key in VAL_KEYS}
        if self.model.shard is not None:  # rank 0's figures decide the best epoch everywhere
            metrics, errors = dist.broadcast_object((metrics, errors), self.runtime)
        if metrics["ndcg_at_100"] > self.state.best_ndcg:
            self.state.best_ndcg = metrics["ndcg_at_100"]
            self.state.best_epoch = epoch
            self.state.best_weights = [np.array(w) for w in self.model.get_weights()]
        return metrics, errors

    def _score_batch(self, batch: Any) -> tf.Tensor:
        """float32 [users, n_items]: inference logits (the mean of the latent code)."""
        return self.model(batch, training=False)[0][:, :self.n_items]

    def exported_weights(self, weights: list[np.ndarray]) -> list[np.ndarray]:
        """``weights`` (in ``model.weights`` order) less the composite prior's frozen encoder,
        which is training state: the exported model is the encoder and the decoder."""
        frozen = {id(v) for v in self.model.prior_variables()}
        return [w for v, w in zip(self.model.weights, weights, strict=True)
                if id(v) not in frozen]

    def weights_digest(self) -> str:
        """SHA-256 of this rank's replicated weights (all but item shards): equal on every
        rank unless replicas diverged."""
        import hashlib

        digest = hashlib.sha256()
        for weight in dist.replicated_variables(self.model, self.optimizer)[0]:
            digest.update(np.ascontiguousarray(weight.numpy()).tobytes())
        return digest.hexdigest()


def user_shares(config: TrainConfig, runtime: dist.Runtime) -> int:
    """How many shares of the users each step is drawn from: one per process, or
    ``--user-shares`` shares trained by one process (a run of that many processes, with
    its batches, in one)."""
    shares = config.user_shares or runtime.size
    if runtime.size != 1 and shares != runtime.size:
        raise VaecfError(f"--user-shares {shares}: this job has {runtime.size} processes "
                         f"(each trains one share: use {runtime.size}, or run one process)")
    return shares


def _describe(record: dict[str, Any]) -> str:
    text = (f"epoch {record['epoch']}: loss {record['loss']:.4f} (nll {record['nll']:.4f}, "
            f"kl {record['kl']:.4f}, beta {record['beta']:.4f}), "
            f"{record['users_per_second']:,.0f} users/s, input {100 * record['input_share']:.0f}%")
    if "val" in record:
        text += f", val ndcg@100 {record['val']['ndcg_at_100']:.4f}"
    return text
