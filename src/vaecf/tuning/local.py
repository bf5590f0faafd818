"""Run a search's trials on this machine: one ``vaecf train`` per trial, in this process.

Each trial is a complete training run (published model directory with its manifest) under
``<output>/trials/trial-NNN``; its checkpoints go to a scratch folder that is removed with
the trial, since a finished trial never resumes. The trials run one after another: on a
laptop, parallel trials would only share the same cores.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vaecf import log
from vaecf.errors import VaecfError
from vaecf.io import read_manifest
from vaecf.tuning.space import describe
from vaecf.tuning.trials import OBJECTIVE, exported_val, record


def trial_name(index: int) -> str:
    return f"trial-{index:03d}"


def run_trials(split: str, directory: Path, scratch: Path, trials: list[dict[str, Any]],
               base: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Train every trial; return their records (``vaecf.tuning.trials.record``).

    Args:
      split: the split directory or s3:// prefix.
      directory: where the trials' model directories are published (``trial-NNN``).
      scratch: an empty folder for checkpoints, deleted by the caller.
      trials: hyperparameters per trial (``vaecf.tuning.space.trials``).
      base: the other ``TrainConfig`` fields, the same for every trial (precision, seed,
        and those of epochs, patience, max_epochs and batch size the tune was given).
    """
    from vaecf.train.config import TrainConfig
    from vaecf.train.run import train

    records = []
    for index, trial in enumerate(trials):
        name = trial_name(index)
        # Trials are numbered from 0 everywhere (log, trials.jsonl, folder names).
        log.info(f"tune: trial {index} of trials 0-{len(trials) - 1} ({name}): "
                 f"{describe(trial)}")
        config = TrainConfig(split=split, output=str(directory / name),
                             checkpoint_dir=str(scratch / name), **{**base, **trial})
        try:
            train(config)
        except (VaecfError, KeyboardInterrupt) as err:
            if isinstance(err, VaecfError) and not str(err).startswith("stopped by"):
                raise
            # train's "rerun to resume" is not true here: the trials and their checkpoints
            # are in the tune's staging folder, which goes with the failed run.
            what = str(err).split(";")[0] if isinstance(err, VaecfError) else "stopped by SIGINT"
            raise VaecfError(f"{what} in trial {index}; the finished trials and this trial's "
                             "checkpoints were in the tune's staging folder and are not kept: "
                             "a rerun starts the search over") from None
        manifest = read_manifest(directory / name, "train")
        entry = record(index, f"{directory.name}/{name}", manifest, exported_val(manifest))
        records.append(entry)
        log.info(f"tune: trial {index} val {OBJECTIVE} {entry['val'][OBJECTIVE]:.4f}"
                 + _stderr(entry) + f" (kept epoch {entry['best_epoch']} of "
                 f"{entry['epochs']}{_beta(entry)})")
    return records


def _stderr(entry: dict[str, Any]) -> str:
    error = entry["val_stderr"].get(OBJECTIVE)
    return "" if error is None else f" +- {error:.4f}"


def _beta(entry: dict[str, Any]) -> str:
    """The KL weight the kept epoch trained with, beside the cap (annealing)."""
    beta, cap = entry["beta_at_best_epoch"], entry["params"].get("beta_cap")
    return "" if beta is None else f", beta {beta:.4g} there of beta_cap {cap}"
