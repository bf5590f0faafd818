"""The speed section of the report, rendered from ``vaecf.report.speed.analyse``."""

from __future__ import annotations

from typing import Any

from vaecf.report import plots
from vaecf.report.document import (
    Figure,
    Section,
    Table,
    fmt,
    fmt_count,
    fmt_percent,
    fmt_ratio,
)
from vaecf.report.speed import label, median

Block = str | list[str] | Table | Figure


def _min_med(config: dict[str, Any], stat: str, digits: int) -> str:
    value = config.get(stat)
    if not isinstance(value, dict):
        return "-"
    if stat in ("input_share", "bound_fraction"):
        return f"{fmt_percent(value['median'])} ({fmt_percent(value['min'])})"
    if stat == "peak_rss_bytes":  # the largest rank's; GB, as README's scale tables
        return f"{fmt(value['median'] / 1e9, 2)} ({fmt(value['min'] / 1e9, 2)})"
    return f"{fmt(value['median'], digits)} ({fmt(value['min'], digits)})"


def _work(speed: dict[str, Any]) -> str:
    devices = sorted({r["device"] for r in speed.get("runs", []) if r.get("device")})
    work = speed.get("work") or {}
    amount = (f"{work['steps']} steps" if work.get("steps") else
              f"{work.get('epochs', '?')} epochs")
    amount += " (whole step compiled with XLA)" if work.get("xla") else ""
    text = (f"Each run trains {amount} after {work.get('warmup_epochs', 1)} warm-up epoch(s) "
            f"that are excluded; {work.get('repeats', '?')} repeat(s) per configuration. "
            "Cells show the median (min) over repeats; train s and s to target include the "
            "warm-up.")
    split = speed.get("split") or {}
    if split:
        kind = ("generated synthetic" if split.get("synthetic")
                else f"given ({split.get('dataset') or 'dataset not recorded'})")
        text += (f" Data: {kind} split, {fmt_count((split.get('n_users') or {}).get('train'))} "
                 f"training users, {fmt_count(split.get('n_items'))} items, "
                 f"{fmt(split.get('nnz_per_user'), 1)} known items per training user.")
    if devices:
        text += f" Device: {'; '.join(devices)}."
    return text


def _bound_blocks(bound: dict[str, Any] | None) -> list[Block]:
    if not bound:
        return []
    rates = bound.get("matmul_flops_per_second") or {}
    rows = [[p, fmt(r / 1e9, 1), fmt(bound_users, 1)] for p, r, bound_users in
            ((p, float(r), float(r) / float(bound["flops_per_user"])) for p, r in rates.items())]
    return [f"Compute bound: {fmt(bound.get('flops_per_user', 0.0) / 1e6, 2)} MFLOP per user "
            f"per training step ({bound.get('formula', '')}). {bound.get('devices', '')}",
            Table(["precision", "measured matmul GFLOP/s", "bound users/s per device"], rows,
                  "Measured dense matmul rate of this device")]


def section(speed: dict[str, Any]) -> Section:
    """Configurations, mixed precision speed-up, strong scaling and the compute bound."""
    blocks = [_work(speed), *_config_blocks(speed), *_precision_blocks(speed),
              *_scaling_blocks(speed), *_bound_blocks(speed.get("compute_bound"))]
    if speed["versus_reference"]:
        blocks.append(Table(["configuration", "users/s", "reference users/s", "ratio"],
                            [[r["config"], fmt(r["users_per_second"], 1),
                              fmt(r["reference_users_per_second"], 1), fmt_ratio(r["ratio"])]
                             for r in speed["versus_reference"]], "Against the reference run"))
    return Section("Speed", blocks)


def _config_blocks(speed: dict[str, Any]) -> list[Block]:
    configs = speed["configs"]
    target = speed.get("target_ndcg")
    rows = [[label(c), f"{c['runs_ok']}/{c['repeats']}", _min_med(c, "users_per_second", 1),
             _min_med(c, "steps_per_second", 2), _min_med(c, "epoch_seconds", 2),
             _min_med(c, "input_share", 1), _min_med(c, "train_seconds", 1),
             _min_med(c, "time_to_target_seconds", 1), _min_med(c, "epochs_to_target", 0),
             _min_med(c, "bound_fraction", 1), _min_med(c, "peak_rss_bytes", 2)]
            for c in configs]
    blocks: list[Block] = [Table(
        ["configuration", "runs ok", "users/s", "steps/s", "epoch s", "input share",
         "train s", f"s to NDCG@100 {fmt(target, 3)}" if target else "s to target",
         "epochs to target", "of bound", "peak memory GB (largest rank)"],
        rows, "Benchmark configurations")]
    ranked = [(c, v) for c in configs if (v := median(c, "users_per_second"))]
    if ranked:
        blocks.append(Figure("Median users/s per configuration", plots.bars(
            "Training throughput", "users/s", [label(c) for c, _ in ranked],
            [v for _, v in ranked])))
    return blocks


def _precision_blocks(speed: dict[str, Any]) -> list[Block]:
    if not speed["precision_speedups"]:
        return []
    return [Table(["precision", "world size", "batch", "speed-up vs fp32"],
                  [[s["precision"], str(s["world_size"]), str(s["batch_size"]),
                    fmt_ratio(s["speedup"])] for s in speed["precision_speedups"]],
                  "Mixed precision vs FP32")]


def _scaling_blocks(speed: dict[str, Any]) -> list[Block]:
    if not any(s["world_size"] > 1 for s in speed["scaling"]):
        return []
    table = Table(["precision", "batch", "world size", "speed-up", "efficiency"],
                  [[s["precision"], str(s["batch_size"]), str(s["world_size"]),
                    fmt_ratio(s["speedup"]), fmt_percent(s["efficiency"])]
                   for s in speed["scaling"]], "Strong scaling (fixed global batch)")
    series: dict[str, tuple[list[int], list[float]]] = {}
    for s in speed["scaling"]:
        sizes, values = series.setdefault(f"{s['precision']} b{s['batch_size']}", ([], []))
        sizes.append(s["world_size"])
        values.append(s["speedup"])
    return [table, Figure("Strong scaling: speed-up and efficiency vs world size",
                          plots.scaling([(k, v[0], v[1]) for k, v in series.items()]))]
