"""Speed from ``benchmark.json``: mixed precision speed-up, strong scaling, time to target,
fraction of the compute bound, and the comparison with a reference run when one is given.

Every comparison uses the median over repeats of each configuration.
"""

from __future__ import annotations

from typing import Any

from vaecf.report.document import fmt, fmt_percent, fmt_ratio


def median(config: dict[str, Any], stat: str) -> float | None:
    value = config.get(stat)
    return float(value["median"]) if isinstance(value, dict) else None


def label(config: dict[str, Any]) -> str:
    rule = config.get("lr_scaling", "none")
    return (f"{config['precision']} x{config['world_size']} b{config['batch_size']}"
            + ("" if rule == "none" else f" lr {rule}")
            + (" sharded" if config.get("shard_items") else ""))


def precision_speedups(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mixed precision users/s over FP32 users/s at the same world size and batch size
    (data-parallel runs)."""
    configs = [c for c in configs if not c.get("shard_items")]
    fp32 = {(c["world_size"], c["batch_size"]): median(c, "users_per_second")
            for c in configs if c["precision"] == "fp32"}
    out = []
    for c in configs:
        base = fp32.get((c["world_size"], c["batch_size"]))
        mixed = median(c, "users_per_second")
        if c["precision"] != "fp32" and base and mixed:
            out.append({"precision": c["precision"], "world_size": c["world_size"],
                        "batch_size": c["batch_size"], "speedup": mixed / base})
    return out


def scaling(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Strong scaling at a fixed global batch: speed-up over world size 1 and efficiency, of
    the data-parallel model (item-sharded runs are compared by item count, not here)."""
    configs = [c for c in configs if not c.get("shard_items")]
    single = {(c["precision"], c["batch_size"]): median(c, "users_per_second")
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
        speed = median(c, "users_per_second")
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
    before = {label(c): median(c, "users_per_second") for c in reference.get("configs", [])}
    out = []
    for c in configs:
        old, new = before.get(label(c)), median(c, "users_per_second")
        if old and new:
            out.append({"config": label(c), "users_per_second": new,
                        "reference_users_per_second": old, "ratio": new / old})
    return out


def analyse(bench: dict[str, Any], reference: dict[str, Any] | None) -> dict[str, Any]:
    """The speed part of ``report.json``; the benchmark's own numbers are copied unchanged."""
    configs = bench["configs"]
    return {"configs": configs, "runs": [{"name": r.get("name"), "device": r.get("device")}
                                         for r in bench.get("runs", [])],
            "precision_speedups": precision_speedups(configs),
            "scaling": scaling(configs), "versus_reference": versus_reference(configs, reference),
            "compute_bound": bench.get("compute_bound"), "work": bench.get("work"),
            "target_ndcg": bench.get("target_ndcg"), "split": bench.get("split"),
            "host_load": host_load(bench.get("fingerprint") or {},
                                   max((c["world_size"] for c in configs), default=1)),
            "ranks_share_host": (bench.get("fingerprint") or {}).get("gpu_count") == 0}


def host_load(machine: dict[str, Any], own: int) -> dict[str, Any] | None:
    """The busiest 1-minute load average seen (start or end) against the usable cores.

    The benchmark's own ranks add up to ``own`` to the load; beyond cores + own, other
    processes were competing for the CPU.
    """
    loads = [x[0] for x in (machine.get("load_average"), machine.get("load_average_end"))
             if isinstance(x, list) and x]
    cores = machine.get("cpu_cores_usable") or machine.get("cpu_cores")
    if not loads or not cores:
        return None
    return {"load": max(loads), "cores": cores, "busy": max(loads) > cores + own}


def verdict(speed: dict[str, Any]) -> list[str]:
    """The fastest configuration, then mixed precision, scaling and reference in a line each."""
    ranked = [c for c in speed["configs"] if median(c, "users_per_second")]
    if not ranked:
        return ["Speed: no benchmark run succeeded."]
    best = max(ranked, key=lambda c: median(c, "users_per_second") or 0.0)
    runs = f"{best['runs_ok']} run" + ("" if best["runs_ok"] == 1 else "s")
    lines = [f"Fastest configuration {label(best)}: "
             f"{fmt(median(best, 'users_per_second'), 1)} users/s (median of {runs}), "
             f"{fmt_percent(median(best, 'bound_fraction'))} of the compute bound."]
    if any((median(c, "bound_fraction") or 0.0) > 1.0 for c in ranked):
        lines.append("A run exceeds 100% of the compute bound: the matmul rate was measured "
                     "below the device's peak (a busy host), so the bound is underestimated.")
    for s in speed["precision_speedups"]:
        lines.append(f"{s['precision']} vs fp32 (x{s['world_size']} b{s['batch_size']}): "
                     f"{fmt_ratio(s['speedup'])} speed-up.")
    scaled = [s for s in speed["scaling"] if s["world_size"] > 1]
    for s in scaled:
        lines.append(f"Strong scaling {s['precision']} b{s['batch_size']} to world size "
                     f"{s['world_size']}: {fmt_ratio(s['speedup'])} speed-up, "
                     f"{fmt_percent(s['efficiency'])} efficiency.")
    if scaled and speed.get("ranks_share_host"):
        lines.append("No GPU: the ranks shared this host's CPU, so strong scaling here measures "
                     "Horovod's overhead, not added hardware.")
    load = speed.get("host_load")
    if load and load["busy"]:
        lines.append(f"Caution: the host was busy during the benchmark (load average "
                     f"{load['load']:.1f} on {load['cores']} cores): other processes took part "
                     "of the CPU, so these speeds understate the code.")
    for r in speed["versus_reference"]:
        lines.append(f"Against the reference run, {r['config']} runs at {fmt_ratio(r['ratio'])} "
                     f"its speed ({fmt(r['users_per_second'], 1)} vs "
                     f"{fmt(r['reference_users_per_second'], 1)} users/s).")
    return lines

