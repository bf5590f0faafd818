"""Benchmark arithmetic shared by ``vaecf benchmark`` and the report: per-run statistics from
a train log, the compute bound of the model, and min/median over repeats.

Compute bound. A Mult-VAE training step costs, per user with ``nnz`` known items, ``n_items``
(padded) items, hidden size ``h`` and latent size ``l``::

    forward = 2*nnz*h           encoder input layer (sparse x dense: one multiply-add per
                                known item and hidden unit)
            + 2*h*(2*l)         hidden -> (mu, logvar)
            + 2*l*h             latent -> decoder hidden
            + 2*h*n_items       decoder hidden -> item logits (the dominant term)
    flops_per_user = 3 * forward    (backward ~ 2x forward)

Bias adds, tanh, softmax and the optimizer update are O(n_items + h) per user or per step and
are left out. The bound is the device's measured dense matmul rate for the precision divided by
``flops_per_user``; a run's fraction of the bound says how much room an implementation has left.
"""

from __future__ import annotations

import statistics
from typing import Any

STATS = ("users_per_second", "steps_per_second", "epoch_seconds", "input_share",
         "train_seconds", "time_to_target_seconds", "epochs_to_target", "bound_fraction",
         "peak_rss_bytes")
KEY = ("precision", "world_size", "batch_size", "lr_scaling", "shard_items")


def flops_per_user(n_items: int, hidden: int, latent: int, nnz_per_user: float) -> float:
    """Training FLOPs per user of one Mult-VAE step (formula in the module docstring)."""
    forward = (2.0 * nnz_per_user * hidden + 2.0 * hidden * 2 * latent + 2.0 * latent * hidden
               + 2.0 * hidden * n_items)
    return 3.0 * forward


def _ndcg(entry: dict[str, Any]) -> float | None:
    val = entry.get("val")
    value = val.get("ndcg_at_100") if isinstance(val, dict) else None
    return float(value) if isinstance(value, int | float) else None


def time_to_target(log: list[dict[str, Any]], target: float) -> tuple[float, int] | None:
    """Training seconds (warm-up included: it is real training) and epochs until val NDCG@100
    >= target. The epochs do not depend on the device, so they carry over to a GPU."""
    seconds = 0.0
    for epochs, entry in enumerate(log, start=1):
        seconds += float(entry["epoch_seconds"])
        ndcg = _ndcg(entry)
        if ndcg is not None and ndcg >= target:
            return seconds, epochs
    return None


def run_stats(log: list[dict[str, Any]], warmup_epochs: int,
              target_ndcg: float | None = None) -> dict[str, Any]:
    """Throughput of one run over its epochs after the warm-up.

    Args:
      log: the run's ``train_log.jsonl`` entries, one per epoch, in order.
      warmup_epochs: leading epochs excluded (tracing, input warm-up).

    Returns:
      users/s and steps/s over the measured epochs (total work / total time), mean epoch
      seconds, input share (input seconds / epoch seconds), time and epochs to the target NDCG.
    """
    if len(log) <= warmup_epochs:
        raise ValueError(f"{len(log)} epochs logged, need more than {warmup_epochs} (warm-up)")
    measured = log[warmup_epochs:]
    seconds = sum(float(e["epoch_seconds"]) for e in measured)
    users = sum(float(e["users_per_second"]) * float(e["epoch_seconds"]) for e in measured)
    steps = int(measured[-1]["step"]) - int(log[warmup_epochs - 1]["step"] if warmup_epochs
                                            else 0)
    waited = sum(float(e.get("input_seconds") or 0.0) for e in measured)
    reached = time_to_target(log, target_ndcg) if target_ndcg is not None else None
    return {"measured_epochs": len(measured), "measured_steps": steps,
            "users_per_second": users / seconds, "steps_per_second": steps / seconds,
            "epoch_seconds": seconds / len(measured), "input_share": waited / seconds,
            "train_seconds": sum(float(e["epoch_seconds"]) for e in log),
            "time_to_target_seconds": reached[0] if reached else None,
            "epochs_to_target": reached[1] if reached else None}


def _min_median(values: list[float]) -> dict[str, float] | None:
    return {"min": min(values), "median": statistics.median(values)} if values else None


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per ``KEY`` (precision, world size, batch, lr rule, item layout): min and
    median of each statistic over the successful repeats (``None`` where none produced it)."""
    configs: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for run in runs:
        configs.setdefault(tuple(run.get(k, "none" if k == "lr_scaling" else False)
                                 for k in KEY), []).append(run)
    out = []
    for key, group in configs.items():
        ok = [r for r in group if r.get("status") == "ok"]
        entry: dict[str, Any] = dict(zip(KEY, key, strict=True))
        entry.update(repeats=len(group), runs_ok=len(ok))
        for stat in STATS:
            entry[stat] = _min_median([r[stat] for r in ok if r.get(stat) is not None])
        out.append(entry)
    return out
