"""Training curves from ``train_log.jsonl``: loss, KL, beta, validation NDCG@100, users/s.

Throughput is summarised over the epochs after the first, which includes graph tracing and
input warm-up and would otherwise understate a short run's speed.
"""

from __future__ import annotations

import statistics
from typing import Any

from vaecf.report import plots
from vaecf.report.document import Figure, Section, Table, fmt, fmt_percent

MAX_ROWS = 40


def _ndcg(entry: dict[str, Any]) -> float | None:
    val = entry.get("val")
    value = val.get("ndcg_at_100") if isinstance(val, dict) else None
    return float(value) if isinstance(value, int | float) else None


def analyse(log: list[dict[str, Any]]) -> dict[str, Any]:
    """The training part of ``report.json`` (per-epoch values are copied from the log)."""
    epochs = [{"epoch": e["epoch"], "step": e.get("step"), "loss": e["loss"],
               "nll": e.get("nll"), "kl": e["kl"], "beta": e["beta"],
               "epoch_seconds": e["epoch_seconds"], "users_per_second": e["users_per_second"],
               "input_share": e.get("input_share"), "ndcg_at_100": _ndcg(e)} for e in log]
    seconds = 0.0
    best: dict[str, Any] | None = None
    for row in epochs:
        seconds += row["epoch_seconds"]
        if row["ndcg_at_100"] is not None and (best is None
                                               or row["ndcg_at_100"] > best["ndcg_at_100"]):
            best = {"epoch": row["epoch"], "ndcg_at_100": row["ndcg_at_100"],
                    "seconds": seconds}
    steady = epochs[1:] or epochs
    first = log[0]
    return {"precision": first.get("precision"), "world_size": first.get("world_size"),
            "batch_size": first.get("batch_size"), "epochs": epochs,
            "time_to_train_seconds": seconds,
            "users_per_second_median": statistics.median(r["users_per_second"] for r in steady),
            "best": best}


def verdict(train: dict[str, Any]) -> list[str]:
    """Time to train and steady throughput, in one sentence."""
    text = (f"Training: {len(train['epochs'])} epochs in {fmt(train['time_to_train_seconds'], 1)} s"
            f", {fmt(train['users_per_second_median'], 1)} users/s median "
            f"({train['precision'] or '?'}, world size {train['world_size'] or '?'}, "
            f"batch {train['batch_size'] or '?'}).")
    best = train["best"]
    if best:
        text += (f" Best validation NDCG@100 {fmt(best['ndcg_at_100'])} at epoch "
                 f"{best['epoch']}, reached after {fmt(best['seconds'], 1)} s.")
    return [text]


def _shown(epochs: list[dict[str, Any]], best: dict[str, Any] | None) -> list[dict[str, Any]]:
    """All epochs if few, else an even sample that keeps the first, best and last epochs."""
    if len(epochs) <= MAX_ROWS:
        return epochs
    stride = -(-len(epochs) // MAX_ROWS)
    keep = set(range(0, len(epochs), stride)) | {len(epochs) - 1}
    keep |= {i for i, e in enumerate(epochs) if best and e["epoch"] == best["epoch"]}
    return [epochs[i] for i in sorted(keep)]


def section(train: dict[str, Any]) -> Section:
    """Curves (figure) and the per-epoch table."""
    epochs = train["epochs"]
    xs = [e["epoch"] for e in epochs]
    figure = plots.panels("Training by epoch", [
        ("Loss", "loss", [("loss", xs, [e["loss"] for e in epochs]),
                          ("NLL", xs, [e["nll"] for e in epochs])]),
        ("KL divergence", "KL", [("KL", xs, [e["kl"] for e in epochs])]),
        ("KL weight beta", "beta", [("beta", xs, [e["beta"] for e in epochs])]),
        ("Validation NDCG@100", "NDCG@100", [("val", xs, [e["ndcg_at_100"] for e in epochs])]),
        ("Throughput", "users/s", [("users/s", xs, [e["users_per_second"] for e in epochs])]),
        ("Input pipeline share", "share", [("input", xs, [e["input_share"] for e in epochs])]),
    ])
    rows = [[str(e["epoch"]), fmt(e["loss"]), fmt(e["kl"]), fmt(e["beta"]),
             fmt(e["ndcg_at_100"]), fmt(e["users_per_second"], 1), fmt(e["epoch_seconds"], 2),
             fmt_percent(e["input_share"])] for e in _shown(epochs, train["best"])]
    caption = "Per epoch" + ("" if len(rows) == len(epochs) else
                             f" ({len(rows)} of {len(epochs)} epochs shown)")
    table = Table(["epoch", "loss", "KL", "beta", "val NDCG@100", "users/s", "epoch s",
                   "input share"], rows, caption)
    return Section("Training curves", [*verdict(train),
                                       Figure("Loss, KL, beta, validation NDCG@100, "
                                              "users/s and input share by epoch", figure),
                                       table])
