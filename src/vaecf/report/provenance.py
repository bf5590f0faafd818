"""Where the numbers come from: the dataset at every step, the configuration, the fingerprint.

All of it is read from the stages' manifests (``--manifests``) and from ``benchmark.json``;
counts are shown as the stages recorded them, in pipeline order.
"""

from __future__ import annotations

import json
from typing import Any

from vaecf.report.document import Section, Table, fmt, fmt_count
from vaecf.report.inputs import STAGE_ORDER

DATA_STAGES = ("download", "preprocess", "dataset")


def flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested dicts as (dotted key, leaf) pairs, in the order they are stored."""
    if isinstance(value, dict):
        pairs: list[tuple[str, Any]] = []
        for key, inner in value.items():
            pairs += flatten(inner, f"{prefix}.{key}" if prefix else str(key))
        return pairs
    return [(prefix, value)]


def _cell(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return fmt_count(value)
    if isinstance(value, float):
        return fmt(value)
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _plain(value: Any) -> str:
    """A parameter as given (``98765``, ``0.07``, ``null``), not formatted as a measurement."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _ordered(manifests: dict[str, dict[str, Any]], stages: tuple[str, ...] | None = None
             ) -> list[str]:
    known = [s for s in STAGE_ORDER if s in manifests]
    names = known + sorted(s for s in manifests if s not in STAGE_ORDER)
    return [s for s in names if stages is None or s in stages]


# Steps of ``vaecf preprocess`` in the order they run (each {rows, users, items}).
PREPROCESS_STEPS = (("raw", "raw rows"), ("implicit", "implicit positives"),
                    ("dedup", "deduplicated"), ("item_filter", "item filter"),
                    ("user_filter", "user filter"), ("k_core", "k-core"),
                    ("output", "preprocess output"))


def funnel(manifests: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Pairs, users and items after each step: preprocess steps, then the split's parts."""
    rows: list[dict[str, Any]] = []
    counts = manifests.get("preprocess", {}).get("counts", {})
    for key, name in PREPROCESS_STEPS:
        step = counts.get(key)
        if isinstance(step, dict) and "rows" in step:
            rows.append({"step": name, "pairs": step["rows"], "users": step.get("users"),
                         "items": step.get("items")})
    split = manifests.get("dataset", {})
    pairs, users = split.get("counts", {}).get("pairs", {}), split.get("n_users", {})
    if isinstance(pairs, dict) and isinstance(users, dict) and "train" in pairs:
        rows.append({"step": "split: train", "pairs": pairs["train"],
                     "users": users.get("train"), "items": split.get("n_items")})
        for name in ("val", "test"):
            parts = [pairs.get(f"{name}_fold_in"), pairs.get(f"{name}_holdout")]
            if all(isinstance(p, int) for p in parts):
                rows.append({"step": f"split: {name} (fold_in + holdout)",
                             "pairs": sum(parts), "users": users.get(name),
                             "items": split.get("n_items")})
    return rows


def analyse(manifests: dict[str, dict[str, Any]], bench: dict[str, Any] | None
            ) -> dict[str, Any]:
    """Dataset counts by step, parameters by stage, and the fingerprint, for ``report.json``."""
    dataset = [{"stage": stage, "counts": manifests[stage].get("counts", {}),
                "n_items": manifests[stage].get("n_items"),
                "n_users": manifests[stage].get("n_users")}
               for stage in _ordered(manifests, DATA_STAGES)]
    configuration = {stage: manifests[stage].get("parameters", {})
                     for stage in _ordered(manifests)}
    versions = {stage: manifests[stage].get("versions", {}) for stage in _ordered(manifests)}
    return {"dataset": dataset, "funnel": funnel(manifests), "configuration": configuration,
            "fingerprint": (bench or {}).get("fingerprint"), "versions": versions}


# Counts the funnel table already shows, by stage (first component of the dotted key).
_IN_FUNNEL = {"preprocess": {key for key, _ in PREPROCESS_STEPS},
              "dataset": {"pairs", "users", "items"}}


def dataset_section(prov: dict[str, Any]) -> Section | None:
    """The data funnel, then every other count each data stage recorded, in pipeline order."""
    rows = []
    for step in prov["dataset"]:
        shown = _IN_FUNNEL.get(step["stage"], set()) if prov["funnel"] else set()
        rows += [[step["stage"], key, _cell(value)] for key, value in flatten(step["counts"])
                 if key.split(".")[0] not in shown]
    if not rows and not prov["funnel"]:
        return None
    blocks: list[Any] = []
    if prov["funnel"]:
        blocks.append(Table(["step", "pairs", "users", "items"],
                            [[r["step"], fmt_count(r["pairs"]), fmt_count(r["users"]),
                              fmt_count(r["items"])] for r in prov["funnel"]],
                            "Raw rows -> implicit -> filtered -> split"))
    if rows:
        blocks.append(Table(["stage", "count", "value"], rows, "Other counts"))
    return Section("Dataset at every step", blocks)


def configuration_section(prov: dict[str, Any], train_config: dict[str, Any] | None
                          ) -> Section | None:
    """Every stage's parameters (from its manifest), plus the run's precision and scale."""
    rows = [[stage, key, _plain(value)] for stage, params in prov["configuration"].items()
            for key, value in flatten(params)]
    if train_config:
        rows += [["train log", key, _plain(value)] for key, value in train_config.items()
                 if value is not None]
    if not rows:
        return None
    return Section("Configuration", [Table(["stage", "parameter", "value"], rows)])


def fingerprint_section(prov: dict[str, Any]) -> Section | None:
    """Hardware and software of the benchmark machine, and library versions per stage."""
    blocks: list[Any] = []
    if prov["fingerprint"]:
        blocks.append(Table(["item", "value"], [[k, _cell(v)] for k, v in
                                                flatten(prov["fingerprint"])],
                            "Benchmark machine"))
    stages: dict[tuple[str, str], list[str]] = {}
    for stage, found in prov["versions"].items():
        for name, version in found.items():
            stages.setdefault((name, str(version)), []).append(stage)
    if stages:
        blocks.append(Table(["library", "version", "stages"],
                            [[name, version, ", ".join(used)]
                             for (name, version), used in sorted(stages.items())],
                            "Versions recorded in the manifests"))
    return Section("Fingerprint", blocks) if blocks else None
