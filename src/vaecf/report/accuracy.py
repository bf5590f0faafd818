"""Accuracy: the model's metrics beside the paper's and the baselines', and the verdict on them.

The paper is Liang et al., "Variational Autoencoders for Collaborative Filtering" (WWW 2018),
Mult-VAE, Table 2: ML-20M, Netflix and MSD (vaecf reads no MSD). Its numbers are compared only
where the data is one of those datasets AND every recorded setting is the paper's protocol;
otherwise the report names the data that was read and shows no paper column.
"""

from __future__ import annotations

import math
import re
from typing import Any

from vaecf.report.document import Figure, Section, Table, fmt, fmt_count
from vaecf.report.inputs import METRIC_KEYS

# Mult-VAE in Table 2, and each dataset's held-out users per split (section 4.2).
PAPER: dict[str, dict[str, Any]] = {
    "ml-20m": {"recall_at_20": 0.395, "recall_at_50": 0.537, "ndcg_at_100": 0.426,
               "heldout_users": 10_000},
    "netflix": {"recall_at_20": 0.351, "recall_at_50": 0.444, "ndcg_at_100": 0.386,
                "heldout_users": 40_000},
}
# The paper's preprocessing (rating > 3.5, users with >= 5 items, no item filter) and holdout.
PAPER_FILTERS = {"min_rating": 4.0, "min_user_items": 5, "min_item_users": 0, "k_core": False}
PAPER_HOLDOUT_FRACTION = 0.2
LABELS = {"recall_at_20": "Recall@20", "recall_at_50": "Recall@50", "ndcg_at_100": "NDCG@100"}
NAMES = {"ml-latest": "ML-latest", "ml-latest-small": "ML-latest-small",
         "movielens": "a MovieLens ratings file", "netflix": "Netflix Prize",
         "lastfm": "Last.fm 360K", "pinterest": "Pinterest (pinterest-20)",
         "synthetic": "synthetic data"}
# Two standard errors: a difference smaller than this is "within noise".
Z = 2.0


def display_name(dataset: str, release: str | None = None) -> str:
    """A readable name: ``ml-1m`` -> ML-1M; a name this table does not know is shown as is."""
    if dataset == "movielens" and release:
        return f"MovieLens (the {display_name(release)} release)"
    if dataset in NAMES:
        return NAMES[dataset]
    size = re.fullmatch(r"ml-(\d+[km])", dataset)
    return f"ML-{size.group(1).upper()}" if size else dataset


def data_of(manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the data stages recorded: dataset name, GroupLens release, layout, settings.

    ``None`` where not recorded; ``preprocess`` and ``split`` hold those stages' parameters.
    """
    found: dict[str, Any] = {"dataset": None, "release": None, "layout": None}
    for stage in ("download", "preprocess", "dataset"):
        manifest = manifests.get(stage, {})
        parts = [p for p in (manifest, manifest.get("parameters")) if isinstance(p, dict)]
        for key in found:
            found[key] = found[key] or next((_text(p.get(key)) for p in parts
                                             if _text(p.get(key))), None)
    for stage, key in (("preprocess", "preprocess"), ("dataset", "split")):
        params = manifests.get(stage, {}).get("parameters")
        found[key] = params if isinstance(params, dict) else None
    return found


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _deviations(data: dict[str, Any], published: dict[str, Any]) -> list[str]:
    """Where the recorded settings differ from the paper's protocol (or are not recorded)."""
    found = []
    for key in ("preprocess", "split"):
        protocol = (data[key] or {}).get("protocol")
        if protocol != "paper":
            found.append(f"{key} protocol '{protocol}'" if protocol
                         else f"{key} protocol not recorded")
    checks = [("preprocess", f"--{k.replace('_', '-')}", k, v) for k, v in PAPER_FILTERS.items()]
    checks += [("split", "--heldout-users", "heldout_users", published["heldout_users"]),
               ("split", "--holdout-fraction", "holdout_fraction", PAPER_HOLDOUT_FRACTION)]
    for stage, flag, key, expected in checks:
        value = (data[stage] or {}).get(key, expected)
        if value != expected:
            found.append(f"{flag} {_plain(value)}, the paper's is {_plain(expected)}")
    return found


def _plain(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "unset" if value is None else str(value)


def comparability(data: dict[str, Any]) -> tuple[bool, str]:
    """Whether the paper's numbers are a fair yardstick, and a sentence saying why."""
    if data["dataset"] is None:
        return False, ("The dataset is not recorded (give the data stages' outputs with "
                       "--manifests), so the paper's numbers are not compared.")
    name = display_name(data["dataset"], data["release"])
    published = PAPER.get(data["dataset"])
    if published is None:
        return False, (f"The data is {name}; the paper published numbers for ML-20M and "
                       "Netflix only, so none are compared.")
    deviations = _deviations(data, published)
    if deviations:
        return False, (f"The data is {name}, but not under the paper's protocol "
                       f"({'; '.join(deviations)}), so the paper's numbers are not compared.")
    return True, (f"The data is {name} under the paper's protocol: the paper's numbers are "
                  "directly comparable.")


def _significant(delta: float, se_a: float, se_b: float) -> bool:
    return abs(delta) > Z * math.sqrt(se_a ** 2 + se_b ** 2)


def analyse(metrics: dict[str, Any], manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The accuracy part of ``report.json``: values copied from ``metrics.json`` plus deltas.

    ``paper`` and ``ratio_to_paper`` are present only where the paper's numbers apply.
    """
    data = data_of(manifests)
    comparable, note = comparability(data)
    rows: dict[str, dict[str, Any]] = {}
    for key in METRIC_KEYS:
        mean, stderr = metrics[key]["mean"], metrics[key]["stderr"]
        rows[key] = {"mean": mean, "stderr": stderr}
        if comparable:
            paper = PAPER[data["dataset"]][key]
            rows[key].update({"paper": paper, "ratio_to_paper": mean / paper})
    baselines = {}
    for name, values in sorted(metrics.get("baselines", {}).items()):
        baselines[name] = {key: {"mean": values[key]["mean"], "stderr": values[key]["stderr"],
                                 "delta": metrics[key]["mean"] - values[key]["mean"]}
                           for key in METRIC_KEYS}
    protocol = (data["split"] or data["preprocess"] or {}).get("protocol")
    return {"subset": metrics.get("subset"), "model": metrics.get("model"),
            "users_evaluated": metrics.get("users_evaluated"),
            "users_skipped": metrics.get("users_skipped"), "dataset": data["dataset"],
            "dataset_name": (display_name(data["dataset"], data["release"])
                             if data["dataset"] else None),
            "release": data["release"], "layout": data["layout"], "protocol": protocol,
            "comparable_to_paper": comparable, "note": note, "metrics": rows,
            "baselines": baselines, "timing": metrics.get("timing"),
            "device": metrics.get("device")}


def verdict(acc: dict[str, Any]) -> list[str]:
    """One sentence on the paper (where it applies) and one per baseline, judged on NDCG@100."""
    ndcg = acc["metrics"]["ndcg_at_100"]
    mean, stderr = ndcg["mean"], ndcg["stderr"]
    measured = f"NDCG@100 {fmt(mean)} ± {fmt(stderr)}"  # the note names the data
    if not acc["comparable_to_paper"]:  # no verdict against a yardstick that does not apply
        lines = [f"Accuracy: {measured}. " + acc["note"]]
    else:
        if mean + Z * stderr >= ndcg["paper"]:
            judged = "matches or beats the paper"
        elif ndcg["ratio_to_paper"] >= 0.95:
            judged = "is close to the paper (within 5%)"
        else:
            judged = "is below the paper"
        lines = [f"Accuracy {judged}: {measured} vs the paper's {fmt(ndcg['paper'], 3)} "
                 f"({ndcg['ratio_to_paper']:.1%} of it). " + acc["note"]]
    for name, values in acc["baselines"].items():
        delta = values["ndcg_at_100"]["delta"]
        noise = not _significant(delta, stderr, values["ndcg_at_100"]["stderr"])
        word = "is within noise of" if noise else ("beats" if delta > 0 else "is worse than")
        lines.append(f"The model {word} the {name} baseline on NDCG@100: {fmt(mean)} vs "
                     f"{fmt(values['ndcg_at_100']['mean'])} ({delta:+.4f}).")
    return lines


def section(acc: dict[str, Any]) -> Section:
    """The accuracy table: the model, the paper (where it applies) and each baseline."""
    names, paper = list(acc["baselines"]), acc["comparable_to_paper"]
    columns = ["metric", f"model ({acc['model'] or '?'})", "± stderr",
               *([f"paper ({acc['dataset_name']})", "% of paper"] if paper else []), *names]
    rows = []
    for key in METRIC_KEYS:
        row = acc["metrics"][key]
        rows.append([LABELS[key], fmt(row["mean"]), fmt(row["stderr"])]
                    + ([fmt(row["paper"], 3), f"{row['ratio_to_paper']:.1%}"] if paper else [])
                    + [fmt(acc["baselines"][n][key]["mean"]) for n in names])
    users = (f"Evaluated on the {acc['subset'] or '?'} users: {fmt_count(acc['users_evaluated'])} "
             f"evaluated, {fmt_count(acc['users_skipped'])} skipped (empty holdout).")
    blocks: list[str | list[str] | Table | Figure] = [acc["note"], users, Table(columns, rows)]
    timing = acc.get("timing")
    if timing:
        rate = timing.get("users_per_second")
        blocks.append(f"Evaluation speed on {acc.get('device') or '?'}: "
                      + (f"{fmt(rate, 1)} users/s" if rate is not None else "no steady rate")
                      + (f" ({timing['steady_rate']})" if timing.get("steady_rate") else "")
                      + f" after a start-up of "
                      f"{fmt(timing['startup_seconds'], 2)} s (process before the stage "
                      f"{fmt(timing['process_seconds_before_stage'], 2)} s, split and model "
                      f"{fmt(timing['load_seconds'], 2)} s, first chunk of "
                      f"{fmt_count(timing['first_chunk_users'])} users "
                      f"{fmt(timing['first_chunk_seconds'], 2)} s).")
    return Section("Accuracy", blocks)
