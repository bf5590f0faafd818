"""Speed from ``benchmark.json``: mixed precision speed-up, strong scaling, time to target,
fraction of the compute bound, and the comparison with a reference run when one is given.

Every comparison uses the median over repeats of each configuration.
"""

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


def _median(config: dict[str, Any], stat: str) -> float | None:
    value = config.get(stat)
    return float(value["median"]) if isinstance(value, dict) else None


def _label(config: dict[str, Any]) -> str:
    return f"{config['precision']} x{config['world_size']} b{config['batch_size']}"


def precision_speedups(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mixed precision users/s over FP32 users/s at the same world size and batch size."""
    fp32 = {(c["world_size"], c["batch_size"]): _median(c, "users_per_second")
            for c in configs if c["precision"] == "fp32"}
    out = []
    for c in configs:
        base = fp32.get((c["world_size"], c["batch_size"]))
        mixed = _median(c, "users_per_second")
        if c["precision"] != "fp32" and base and mixed:
            out.append({"precision": c["precision"], "world_size": c["world_size"],
                        "batch_size": c["batch_size"], "speedup": mixed / base})
    return out


def scaling(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Strong scaling at a fixed global batch: speed-up over world size 1 and efficiency."""
    single = {(c["precision"], c["batch_size"]): _median(c, "users_per_second")
              for c in configs if c["world_size"] == 1}
    sizes: dict[tuple[str, int], int] = {}
    for c in configs:
        sizes[(c["precision"], c["batch_size"])] = sizes.get((c["precision"], c["batch_size"]),
                                                             0) + 1
    out = []
    for c in sorted(configs, key=lambda c: (c["precision"], c["batch_size"], c["world_size"])):
        if sizes[(c["precision"], c["batch_size"])] < 2:
            continue  # one world size only: nothing to scale
        base = single.get((c["precision"], c["batch_size"]))
        speed = _median(c, "users_per_second")
        if base and speed:
            speedup = speed / base
            out.append({"precision": c["precision"], "batch_size": c["batch_size"],
                        "world_size": c["world_size"], "speedup": speedup,
                        "efficiency": speedup / c["world_size"]})
    return out


def versus_reference(configs: list[dict[str, Any]], reference: dict[str, Any] | None
                     ) -> list[dict[str, Any]]:
    """users/s of each configuration over the same configuration in the reference run."""
    if not reference:
        return []
    before = {_label(c): _median(c, "users_per_second") for c in reference.get("configs", [])}
    out = []
    for c in configs:
        old, new = before.get(_label(c)), _median(c, "users_per_second")
        if old and new:
            out.append({"config": _label(c), "users_per_second": new,
                        "reference_users_per_second": old, "ratio": new / old})
    return out


def analyse(bench: dict[str, Any], reference: dict[str, Any] | None) -> dict[str, Any]:
    """The speed part of ``report.json``; the benchmark's own numbers are copied unchanged."""
    configs = bench["configs"]
    return {"configs": configs, "precision_speedups": precision_speedups(configs),
            "scaling": scaling(configs), "versus_reference": versus_reference(configs, reference),
            "compute_bound": bench.get("compute_bound"), "work": bench.get("work"),
            "target_ndcg": bench.get("target_ndcg"), "split": bench.get("split")}


def verdict(speed: dict[str, Any]) -> list[str]:
    """The fastest configuration, then mixed precision, scaling and reference in a line each."""
    ranked = [c for c in speed["configs"] if _median(c, "users_per_second")]
    if not ranked:
        return ["Speed: no benchmark run succeeded."]
    best = max(ranked, key=lambda c: _median(c, "users_per_second") or 0.0)
    lines = [f"Fastest configuration {_label(best)}: "
             f"{fmt(_median(best, 'users_per_second'), 1)} users/s (median of "
             f"{best['runs_ok']} runs), {fmt_percent(_median(best, 'bound_fraction'))} of "
             "the compute bound."]
    for s in speed["precision_speedups"]:
        lines.append(f"{s['precision']} vs fp32 (x{s['world_size']} b{s['batch_size']}): "
                     f"{fmt_ratio(s['speedup'])} speed-up.")
    for s in speed["scaling"]:
        if s["world_size"] > 1:
            lines.append(f"Strong scaling {s['precision']} b{s['batch_size']} to world size "
                         f"{s['world_size']}: {fmt_ratio(s['speedup'])} speed-up, "
                         f"{fmt_percent(s['efficiency'])} efficiency.")
    for r in speed["versus_reference"]:
        lines.append(f"vs the reference run, {r['config']}: {fmt_ratio(r['ratio'])} "
                     f"({fmt(r['users_per_second'], 1)} vs "
                     f"{fmt(r['reference_users_per_second'], 1)} users/s).")
    return lines


def _min_med(config: dict[str, Any], stat: str, digits: int) -> str:
    value = config.get(stat)
    if not isinstance(value, dict):
        return "-"
    if stat in ("input_share", "bound_fraction"):
        return f"{fmt_percent(value['median'])} ({fmt_percent(value['min'])})"
    return f"{fmt(value['median'], digits)} ({fmt(value['min'], digits)})"


def _work(speed: dict[str, Any]) -> str:
    work = speed.get("work") or {}
    amount = (f"{work['steps']} steps" if work.get("steps") else
              f"{work.get('epochs', '?')} epochs")
    text = (f"Each run trains {amount} after {work.get('warmup_epochs', 1)} warm-up epoch(s) "
            f"that are excluded; {work.get('repeats', '?')} repeat(s) per configuration. "
            "Cells show the median (min) over repeats.")
    split = speed.get("split") or {}
    if split:
        kind = "synthetic ML-20M-shaped" if split.get("synthetic") else "given"
        text += (f" Data: {kind} split, {fmt_count(split.get('n_items'))} items, "
                 f"{fmt(split.get('nnz_per_user'), 1)} known items per training user.")
    return text


def _bound_blocks(bound: dict[str, Any] | None) -> list[str | list[str] | Table | Figure]:
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
    configs = speed["configs"]
    blocks: list[str | list[str] | Table | Figure] = [_work(speed)]
    target = speed.get("target_ndcg")
    rows = [[_label(c), f"{c['runs_ok']}/{c['repeats']}", _min_med(c, "users_per_second", 1),
             _min_med(c, "steps_per_second", 2), _min_med(c, "epoch_seconds", 2),
             _min_med(c, "input_share", 1), _min_med(c, "time_to_target_seconds", 1),
             _min_med(c, "bound_fraction", 1)] for c in configs]
    blocks.append(Table(["configuration", "runs ok", "users/s", "steps/s", "epoch s",
                         "input share",
                         f"s to NDCG@100 {fmt(target, 3)}" if target else "s to target",
                         "of bound"], rows, "Benchmark configurations"))
    ranked = [(c, v) for c in configs if (v := _median(c, "users_per_second"))]
    if ranked:
        blocks.append(Figure("Median users/s per configuration", plots.bars(
            "Training throughput", "users/s", [_label(c) for c, _ in ranked],
            [v for _, v in ranked])))
    if speed["precision_speedups"]:
        blocks.append(Table(["precision", "world size", "batch", "speed-up vs fp32"],
                            [[s["precision"], str(s["world_size"]), str(s["batch_size"]),
                              fmt_ratio(s["speedup"])] for s in speed["precision_speedups"]],
                            "Mixed precision vs FP32"))
    if any(s["world_size"] > 1 for s in speed["scaling"]):
        blocks.append(Table(["precision", "batch", "world size", "speed-up", "efficiency"],
                            [[s["precision"], str(s["batch_size"]), str(s["world_size"]),
                              fmt_ratio(s["speedup"]), fmt_percent(s["efficiency"])]
                             for s in speed["scaling"]], "Strong scaling (fixed global batch)"))
        series: dict[str, tuple[list[int], list[float]]] = {}
        for s in speed["scaling"]:
            sizes, values = series.setdefault(f"{s['precision']} b{s['batch_size']}", ([], []))
            sizes.append(s["world_size"])
            values.append(s["speedup"])
        blocks.append(Figure("Strong scaling: speed-up and efficiency vs world size",
                             plots.scaling([(k, v[0], v[1]) for k, v in series.items()])))
    blocks += _bound_blocks(speed.get("compute_bound"))
    if speed["versus_reference"]:
        blocks.append(Table(["configuration", "users/s", "reference users/s", "ratio"],
                            [[r["config"], fmt(r["users_per_second"], 1),
                              fmt(r["reference_users_per_second"], 1), fmt_ratio(r["ratio"])]
                             for r in speed["versus_reference"]], "Against the reference run"))
    return Section("Speed", blocks)
