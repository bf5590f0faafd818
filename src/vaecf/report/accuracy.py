"""Accuracy: the model's metrics beside the paper's and the baselines', and the verdict on them.

The paper is Liang et al., "Variational Autoencoders for Collaborative Filtering" (WWW 2018),
Mult-VAE, Table 2: ML-20M, Netflix and MSD (vaecf reads no MSD). Its numbers are compared only
where the data is one of those datasets AND every recorded setting is the paper's protocol;
otherwise the report names the data that was read and shows no paper column.
"""

from __future__ import annotations

from typing import Any

from vaecf.report.data_identity import data_of, describe, named_release
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
# |z| of the paired test above which a difference is not "within noise" (two-sided ~95%).
Z = 2.0


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
    name, release = describe(data), named_release(data)
    published = PAPER.get(release or "")
    if published is None:
        return False, (f"The data is {name}; the paper published numbers for ML-20M and "
                       "Netflix only (a MovieLens release counts once its published checksum "
                       "matched), so none are compared.")
    deviations = _deviations(data, published)
    if deviations:
        return False, (f"The data is {name}, but not under the paper's protocol "
                       f"({'; '.join(deviations)}), so the paper's numbers are not compared.")
    return True, (f"The data is {name} under the paper's protocol: the paper's numbers are "
                  "directly comparable.")


def paired(baseline: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The paired per-user comparison ``vaecf evaluate`` recorded for ``key``, if any."""
    found = baseline.get("paired", {})
    value = found.get(key) if isinstance(found, dict) else None
    return value if isinstance(value, dict) and {"z", "test", "users"} <= set(value) else None


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
                                 "delta": metrics[key]["mean"] - values[key]["mean"],
                                 "paired": paired(values, key)}
                           for key in METRIC_KEYS}
    protocol = (data["split"] or data["preprocess"] or {}).get("protocol")
    return {"subset": metrics.get("subset"), "model": metrics.get("model"),
            "users_evaluated": metrics.get("users_evaluated"),
            "users_skipped": metrics.get("users_skipped"), "dataset": data["dataset"],
            "dataset_name": describe(data) if data["dataset"] else None,
            "release": named_release(data) if data["dataset"] else None,
            "layout": data["layout"], "protocol": protocol,
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
        lines.append(_versus(name, mean, values["ndcg_at_100"]))
    return lines


def _versus(name: str, mean: float, baseline: dict[str, Any]) -> str:
    """One baseline judged by the paired test on the same users; unjudged without one."""
    delta, test = baseline["delta"], baseline["paired"]
    values = f"{fmt(mean)} vs {fmt(baseline['mean'])} ({delta:+.4f}"
    if test is None:
        return (f"The model vs the {name} baseline on NDCG@100: {values}); not judged: "
                "metrics.json has no paired per-user comparison (rerun vaecf evaluate).")
    if (abs(test["z"]) <= Z) if test["z"] is not None else delta == 0:
        word = "is within noise of"
    else:
        word = "beats" if delta > 0 else "is worse than"
    return (f"The model {word} the {name} baseline on NDCG@100: {values}, {test['test']} "
            f"over {fmt_count(test['users'])} users: z = {_z(test['z'])}).")


def _z(z: float | None) -> str:
    return "undefined (the same difference for every user)" if z is None else f"{z:+.2f}"


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
