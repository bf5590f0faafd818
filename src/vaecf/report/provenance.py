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


def _ordered(manifests: dict[str, dict[str, Any]], stages: tuple[str, ...] | None = None
             ) -> list[str]:
    known = [s for s in STAGE_ORDER if s in manifests]
    names = known + sorted(s for s in manifests if s not in STAGE_ORDER)
    return [s for s in names if stages is None or s in stages]


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
    return {"dataset": dataset, "configuration": configuration,
            "fingerprint": (bench or {}).get("fingerprint"), "versions": versions}


def dataset_section(prov: dict[str, Any]) -> Section | None:
    """The data funnel: every count each data stage recorded, in pipeline order."""
    rows = []
    for step in prov["dataset"]:
        extra = {"n_items": step["n_items"], "n_users": step["n_users"]}
        pairs = flatten(step["counts"]) + flatten({k: v for k, v in extra.items() if v})
        rows += [[step["stage"], key, _cell(value)] for key, value in pairs]
    if not rows:
        return None
    return Section("Dataset at every step",
                   ["Counts as recorded by each data stage (raw rows -> implicit -> filtered "
                    "-> split).", Table(["stage", "count", "value"], rows)])


def configuration_section(prov: dict[str, Any], train_config: dict[str, Any] | None
                          ) -> Section | None:
    """Every stage's parameters (from its manifest), plus the run's precision and scale."""
    rows = [[stage, key, _cell(value)] for stage, params in prov["configuration"].items()
            for key, value in flatten(params)]
    if train_config:
        rows += [["train log", key, _cell(value)] for key, value in train_config.items()
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
    versions = [[stage, name, str(version)] for stage, found in prov["versions"].items()
                for name, version in sorted(found.items())]
    if versions:
        blocks.append(Table(["stage", "library", "version"], versions,
                            "Versions recorded in the manifests"))
    return Section("Fingerprint", blocks) if blocks else None
