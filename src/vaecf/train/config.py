"""The trainer's configuration: one frozen dataclass built by ``vaecf train`` from its flags."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

PRECISIONS = ("fp32", "mixed_float16", "mixed_bfloat16")

# Parameters that fix the shapes or the arithmetic of the checkpointed state: a checkpoint
# written with other values cannot be resumed.
STATE_PARAMETERS = ("hidden", "latent", "precision", "seed", "batch_size")


@dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters and run settings (defaults: Liang et al. 2018 for ML-20M).

    Attributes:
      split: split directory or s3:// prefix (output of ``vaecf split``).
      output: model directory or s3:// prefix (published atomically on rank 0).
      checkpoint_dir: where checkpoints live; survives a killed run.
      batch_size: global batch (users per step over all ranks).
      anneal_steps: steps over which beta grows linearly to ``beta_cap`` (0: constant cap).
      steps_per_epoch: steps per epoch; None = one pass over the training users.
      validate_every: validate (and consider for export) every N epochs; the last epoch
        is always validated.
      expect_world_size, expect_hosts: fail at start-up unless the job has this shape.
    """

    split: str
    output: str
    checkpoint_dir: str
    epochs: int = 20
    batch_size: int = 500
    precision: str = "fp32"
    xla: bool = False
    learning_rate: float = 1e-3
    beta_cap: float = 0.2
    anneal_steps: int = 200_000
    dropout: float = 0.5
    hidden: int = 600
    latent: int = 200
    l2: float = 0.0
    seed: int = 0
    validate_every: int = 1
    checkpoint_every: int = 1
    steps_per_epoch: int | None = None
    expect_world_size: int | None = None
    expect_hosts: int | None = None

    @property
    def keras_policy(self) -> str:
        """The Keras dtype policy name of ``precision``."""
        return "float32" if self.precision == "fp32" else self.precision

    def parameters(self) -> dict[str, Any]:
        """Everything but the locations: what the manifest and checkpoints record."""
        values = asdict(self)
        for key in ("split", "output", "checkpoint_dir"):
            values.pop(key)
        return values
