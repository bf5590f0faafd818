"""The trainer's configuration: one frozen dataclass built by ``vaecf train`` from its flags."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

PRECISIONS = ("fp32", "mixed_float16", "mixed_bfloat16")
COMPRESSIONS = ("none", "fp16")
EASE_BLENDS = ("auto", "off")
# ``--ease-blend auto`` up to this catalogue: EASE's float32 weights are 4 n^2 bytes in the
# exported model (2.5 GB here; ML-20M's 20,108 items: 1.6 GB) and 12 n^2 while computed.
EASE_BLEND_MAX_ITEMS = 25_000
DEFAULT_BATCH_SIZE = 500
# Without --epochs: train until the validation NDCG@100 has not improved for PATIENCE epochs,
# at most MAX_EPOCHS (CiteULike-a's five-layer default scored 0.290 after the old
# fixed 20 epochs and 0.326 after 100; its best epochs fell between 57 and 95, and a 200-epoch
# run's at 181). A patience of 20 stopped the default width-1200 model at epoch 73 (best 53,
# validation 0.3399); its validation NDCG@100 went on rising to 0.3462 at epoch 91 (issue 41;
# Results, accuracy): 388 validation users make the curve too noisy for 20.
DEFAULT_MAX_EPOCHS = 200
DEFAULT_PATIENCE = 40

# Parameters that fix the shapes or the arithmetic of the checkpointed state: a checkpoint
# written with other values cannot be resumed.
STATE_PARAMETERS = ("hidden", "latent", "precision", "seed", "batch_size", "encoder_layers",
                    "composite_prior")


@dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters and run settings (defaults: Liang et al. 2018 for ML-20M, but for
    RecVAE's five-layer encoder, a hidden width of 1200, learning rate 5e-4 and a patience of
    40 epochs, measured better on CiteULike-a: Results, accuracy).

    Attributes:
      split: split directory or s3:// prefix (output of ``vaecf split``).
      output: model directory or s3:// prefix (published atomically on rank 0).
      checkpoint_dir: where checkpoints live; survives a killed run.
      batch_size: global batch (users per step over all ranks).
      batch_size_default: ``batch_size`` is the default, not the user's choice, so a split
        with fewer training users trains with all of them per step instead of failing.
      anneal_steps: beta = min(beta_cap, step / anneal_steps), as in the paper's code (0: the
        cap from the start). None: beta reaches the cap at the run's last step
        (``resolved``), which fits a 600-user file and ML-20M alike; the paper's 200,000 keeps
        beta at 0.001 after a small run's 200 steps, i.e. no KL term.
      steps_per_epoch: steps per epoch; None = one pass over the training users.
      steps_per_call: training steps the device runs per call from the host, its batches
        gathered inside (``vaecf.train.calls``; never past a pass's end), at most
        ``vaecf.io.bounds.STEPS_PER_CALL``; 0: chosen from the measured speed (about a quarter
        of a second per call). The weights do not depend on it.
      epochs: a fixed number of epochs (``--epochs``), or None: early stopping, i.e. train
        until the validation NDCG@100 has not improved for ``patience`` epochs, at most
        ``max_epochs`` (Keras' ``EarlyStopping(patience=...)`` with ``fit(epochs=max)``); the
        best epoch is exported either way.
      validate_every: validate (and consider for export) every N epochs; the last epoch
        is always validated.
      checkpoint_interval: checkpoint after the first epoch that ends this many seconds after
        the previous checkpoint (or the start); the last epoch always checkpoints. Writing
        every epoch doubled a small run's time (issue 13); 0 writes every epoch.
      checkpoint_every: also checkpoint every N epochs (None: by time only).
      expect_world_size, expect_hosts: fail at start-up unless the job has this shape.
      compression: "fp16" sends the gradients (and the logged loss statistics) through
        Horovod's allreduce as float16 (half the bytes; for runs across hosts), "none" as
        float32.
      tensorboard_dir: rank 0 writes TensorBoard event files here (local or s3://), or None.
      item_chunk: items per chunk of the training likelihood (0: the whole [users, items]
        logits at once; None: chosen by size, ``vaecf.model.choose_item_chunk``).
      shard_items: split the item layers (and their Adam moments) over the ranks
        (``vaecf.model.shard``); checkpoints are written by shard.
      user_shares: each step is drawn from this many shares of the training users, a part
        from each (``vaecf.train.data``); each process trains one share and reads only its
        rows, or one process trains every share (the batches of a run of that many
        processes). None: one share per process.

    RecVAE's training options (Shenbin et al., WSDM 2020) and ImplicitSLIM (ICLR 2024); off
    (``encoder_layers`` 1 and the others' defaults), the model and the step are exactly
    Mult-VAE's:

    Attributes:
      kl_per_item: gamma: each user's KL weight is gamma times the user's item count, with no
        annealing (``beta_cap`` and ``anneal_steps`` then unused). None: beta for everyone.
      composite_prior: the KL term against a mixture of N(0, I), the previous posterior (a
        frozen copy of the encoder, updated every epoch) and a wide normal.
      alternate: N > 0: each epoch is N encoder-only passes with input dropout, then one
        decoder-only pass without (the frozen encoder is updated in between). 0: joint.
      encoder_layers: 1: Mult-VAE's encoder; N > 1: RecVAE's N dense + LayerNorm + swish
        layers, each fed the sum of the earlier ones. The default, 5, is the one option
        measured better than Mult-VAE's (README, Results); 1 is the model as published.
      implicit_slim_every: N > 0: before every N-th epoch, set the two item embeddings from
        ImplicitSLIM's closed form (``vaecf.model.implicit_slim``), with its ridge penalty
        ``implicit_slim_lambda``, scale ``implicit_slim_alpha`` and the item count below
        which an item has no say, ``implicit_slim_threshold``. 0: never.
      ease_blend: ``auto``: the exported scores blend EASE's closed form (ridge penalty
        ``ease_lambda``) at the weight the validation users choose, where the catalogue
        allows it (``vaecf.train.ease_blend``); ``off``: the model's logits alone.
    """

    split: str
    output: str
    checkpoint_dir: str
    epochs: int | None = None
    max_epochs: int = DEFAULT_MAX_EPOCHS
    patience: int = DEFAULT_PATIENCE
    batch_size: int = DEFAULT_BATCH_SIZE
    batch_size_default: bool = False
    precision: str = "fp32"
    xla: bool = False
    learning_rate: float = 5e-4  # with hidden 1200: measured better than 1e-3 and 600 (Results)
    beta_cap: float = 0.2
    anneal_steps: int | None = None
    dropout: float = 0.5
    hidden: int = 1200
    latent: int = 200
    l2: float = 0.0
    seed: int = 0
    validate_every: int = 1
    checkpoint_interval: float = 600.0
    checkpoint_every: int | None = None
    steps_per_epoch: int | None = None
    steps_per_call: int = 0
    expect_world_size: int | None = None
    expect_hosts: int | None = None
    compression: str = "none"
    tensorboard_dir: str | None = None
    item_chunk: int | None = None
    shard_items: bool = False
    user_shares: int | None = None
    kl_per_item: float | None = None
    composite_prior: bool = False
    alternate: int = 0
    encoder_layers: int = 5  # measured better than 1 (README, Results)
    implicit_slim_every: int = 0
    implicit_slim_lambda: float = 500.0
    implicit_slim_alpha: float = 1.0
    implicit_slim_threshold: int = 10
    # measured better than the model alone on CiteULike-a and ML-1M >= 3 (Results, accuracy)
    ease_blend: str = "auto"
    ease_lambda: float = 500.0

    @property
    def epoch_cap(self) -> int:
        """The last epoch the run may reach: ``epochs``, or ``max_epochs`` when stopping early."""
        return self.max_epochs if self.epochs is None else self.epochs

    def patience_spent(self, epoch: int, best_epoch: int | None) -> bool:
        """Early stopping: no validated improvement in the ``patience`` epochs up to ``epoch``.

        Read from the state a checkpoint holds (the epoch and the best epoch), so a resumed run
        stops where the uninterrupted one would have."""
        return (self.epochs is None and best_epoch is not None
                and epoch - best_epoch >= self.patience)

    @property
    def passes(self) -> tuple[str, ...]:
        """The phase of each pass over the training users in one epoch (``MultVAE.PHASES``)."""
        return ("encoder",) * self.alternate + ("decoder",) if self.alternate else ("joint",)

    @property
    def keras_policy(self) -> str:
        """The Keras dtype policy name of ``precision``."""
        return "float32" if self.precision == "fp32" else self.precision

    @property
    def inputs(self) -> tuple[str, str]:
        """What training reads, which its output may never replace or lie in."""
        return (self.split, self.checkpoint_dir)

    def resolved(self, steps_per_epoch: int) -> TrainConfig:
        """This configuration with a default ``anneal_steps`` made concrete for the run.

        The step index of the run's last update is ``epoch_cap * steps_per_epoch - 1``; beta
        reaches the cap there (stopping early: at ``max_epochs``, so an early stop exports an
        epoch whose beta is below the cap, as Liang et al.'s annealing does). The same
        ``--epochs`` (or ``--max-epochs``) gives the same schedule on resume.
        """
        if self.anneal_steps is not None:
            return self
        last = self.epoch_cap * len(self.passes) * steps_per_epoch - 1
        return replace(self, anneal_steps=int(last / self.beta_cap) if self.beta_cap > 0 else 0)

    def parameters(self) -> dict[str, Any]:
        """Everything but the locations: what the manifest and checkpoints record."""
        values = asdict(self)
        for key in ("split", "output", "checkpoint_dir"):
            values.pop(key)
        return values
