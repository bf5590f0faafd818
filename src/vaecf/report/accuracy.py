"""Accuracy: the model's metrics beside the paper's and the baselines', and the verdict on them.

The paper is Liang et al., "Variational Autoencoders for Collaborative Filtering" (WWW 2018),
Mult-VAE on ML-20M (Table 2). Its numbers are comparable only on ML-20M under the paper's
protocol; on any other data the comparison is reported as indicative only.
"""

from __future__ import annotations

import math
from typing import Any

from vaecf.report.document import Figure, Section, Table, fmt, fmt_count
from vaecf.report.inputs import METRIC_KEYS

PAPER = {"recall_at_20": 0.395, "recall_at_50": 0.537, "ndcg_at_100": 0.426}
LABELS = {"recall_at_20": "Recall@20", "recall_at_50": "Recall@50", "ndcg_at_100": "NDCG@100"}
# Two standard errors: a difference smaller than this is "within noise".
Z = 2.0


def dataset_of(manifests: dict[str, dict[str, Any]]) -> tuple[str | None, str | None]:
    """(dataset name, protocol) as recorded in the manifests, ``None`` where not recorded."""
    dataset = protocol = None
    for stage in ("download", "preprocess", "dataset"):
        manifest = manifests.get(stage, {})
        for part in (manifest, manifest.get("parameters", {}), manifest.get("inputs", {})):
            if isinstance(part, dict):
                dataset = dataset or _text(part.get("dataset"))
                protocol = protocol or _text(part.get("protocol"))
    return dataset, protocol


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def comparability(dataset: str | None, protocol: str | None) -> tuple[bool, str]:
    """Whether the paper's numbers are a fair yardstick, and a sentence saying why."""
    if dataset is None:
        return False, ("The dataset is not recorded (give the data stages' outputs with "
                       "--manifests): the comparison with the paper is indicative only.")
    if dataset != "ml-20m":
        return False, (f"The dataset is {dataset}, not ML-20M: the comparison with the paper "
                       "is indicative only.")
    if protocol not in (None, "paper"):
        return False, (f"ML-20M under the '{protocol}' protocol, not the paper's: the "
                       "comparison with the paper is indicative only.")
    return True, "ML-20M: the paper's numbers are directly comparable."


def _significant(delta: float, se_a: float, se_b: float) -> bool:
    return abs(delta) > Z * math.sqrt(se_a ** 2 + se_b ** 2)


def analyse(metrics: dict[str, Any], manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The accuracy part of ``report.json``: values copied from ``metrics.json`` plus deltas."""
    dataset, protocol = dataset_of(manifests)
    comparable, note = comparability(dataset, protocol)
    rows = {}
    for key in METRIC_KEYS:
        mean, stderr = metrics[key]["mean"], metrics[key]["stderr"]
        rows[key] = {"mean": mean, "stderr": stderr, "paper": PAPER[key],
                     "ratio_to_paper": mean / PAPER[key]}
    baselines = {}
    for name, values in sorted(metrics.get("baselines", {}).items()):
        baselines[name] = {key: {"mean": values[key]["mean"], "stderr": values[key]["stderr"],
                                 "delta": metrics[key]["mean"] - values[key]["mean"]}
                           for key in METRIC_KEYS}
    return {"subset": metrics.get("subset"), "model": metrics.get("model"),
            "users_evaluated": metrics.get("users_evaluated"),
            "users_skipped": metrics.get("users_skipped"), "dataset": dataset,
            "protocol": protocol, "comparable_to_paper": comparable, "note": note,
            "metrics": rows, "baselines": baselines, "timing": metrics.get("timing"),
            "device": metrics.get("device")}


def verdict(acc: dict[str, Any]) -> list[str]:
    """One sentence on the paper and one per baseline, judged on NDCG@100."""
    ndcg = acc["metrics"]["ndcg_at_100"]
    mean, stderr = ndcg["mean"], ndcg["stderr"]
    if not acc["comparable_to_paper"]:  # no verdict against a yardstick that does not apply
        judged = "cannot be judged against the paper"
    elif mean + Z * stderr >= PAPER["ndcg_at_100"]:
        judged = "matches or beats the paper"
    elif ndcg["ratio_to_paper"] >= 0.95:
        judged = "is close to the paper (within 5%)"
    else:
        judged = "is below the paper"
    share = (f"({ndcg['ratio_to_paper']:.1%} of it)" if acc["comparable_to_paper"]
             else "on ML-20M")
    lines = [f"Accuracy {judged}: NDCG@100 {fmt(mean)} ± {fmt(stderr)} vs the paper's "
             f"{fmt(PAPER['ndcg_at_100'], 3)} {share}. " + acc["note"]]
    for name, values in acc["baselines"].items():
        delta = values["ndcg_at_100"]["delta"]
        noise = not _significant(delta, stderr, values["ndcg_at_100"]["stderr"])
        word = "within noise of" if noise else ("beats" if delta > 0 else "is worse than")
        lines.append(f"The model {word} the {name} baseline on NDCG@100: {fmt(mean)} vs "
                     f"{fmt(values['ndcg_at_100']['mean'])} ({delta:+.4f}).")
    return lines


def section(acc: dict[str, Any]) -> Section:
    """The accuracy table: the model, the paper and each baseline, one row per metric."""
    names = list(acc["baselines"])
    columns = ["metric", f"model ({acc['model'] or '?'})", "± stderr", "paper (ML-20M)",
               "% of paper", *names]
    rows = []
    for key in METRIC_KEYS:
        row = acc["metrics"][key]
        rows.append([LABELS[key], fmt(row["mean"]), fmt(row["stderr"]), fmt(row["paper"], 3),
                     f"{row['ratio_to_paper']:.1%}"]
                    + [fmt(acc["baselines"][n][key]["mean"]) for n in names])
    users = (f"Evaluated on the {acc['subset'] or '?'} users: {fmt_count(acc['users_evaluated'])} "
             f"evaluated, {fmt_count(acc['users_skipped'])} skipped (empty holdout).")
    blocks: list[str | list[str] | Table | Figure] = [acc["note"], users, Table(columns, rows)]
    timing = acc.get("timing")
    if timing:
        blocks.append(f"Evaluation speed on {acc.get('device') or '?'}: "
                      f"{fmt(timing['users_per_second'], 1)} users/s after a start-up of "
                      f"{fmt(timing['startup_seconds'], 2)} s (process before the stage "
                      f"{fmt(timing['process_seconds_before_stage'], 2)} s, split and model "
                      f"{fmt(timing['load_seconds'], 2)} s, first chunk of "
                      f"{fmt_count(timing['first_chunk_users'])} users "
                      f"{fmt(timing['first_chunk_seconds'], 2)} s).")
    return Section("Accuracy", blocks)
