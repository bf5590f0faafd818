"""Read and check the report's inputs: train log, metrics, benchmark results, manifests.

Every input is optional. Each one is validated when read, so a malformed file stops the
report with one line naming the file and what was wrong, before anything is written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vaecf.errors import VaecfError
from vaecf.io import open_input, read_manifest
from vaecf.io.publish import read_json, read_jsonl
from vaecf.tuning.trials import read_trials

METRIC_KEYS = ("recall_at_20", "recall_at_50", "ndcg_at_100")
TRAIN_LOG_KEYS = ("epoch", "loss", "kl", "beta", "epoch_seconds", "users_per_second")
RUN_KEYS = ("precision", "world_size", "batch_size")
# Pipeline order of the stages whose manifests describe the data and the run.
STAGE_ORDER = ("download", "preprocess", "dataset", "train", "evaluate", "benchmark")


@dataclass
class ReportInputs:
    """Everything the report was given; ``None`` (or empty) where an input was not."""

    train_log: list[dict[str, Any]] | None = None
    metrics: dict[str, Any] | None = None
    benchmark: dict[str, Any] | None = None
    reference: dict[str, Any] | None = None
    trials: list[dict[str, Any]] | None = None
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    sources: dict[str, Any] = field(default_factory=dict)


def _is_number(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def read_train_log(uri: str) -> list[dict[str, Any]]:
    """The epochs of ``train_log.jsonl`` (one JSON object per line), checked."""
    epochs: list[dict[str, Any]] = []
    for number, entry in read_jsonl(uri):
        if not isinstance(entry, dict):
            raise VaecfError(f"{uri}: line {number}: expected a JSON object")
        bad = [k for k in TRAIN_LOG_KEYS if not _is_number(entry.get(k))]
        if bad:
            raise VaecfError(f"{uri}: line {number}: missing or non-numeric {', '.join(bad)}")
        epochs.append(entry)
    if not epochs:
        raise VaecfError(f"{uri}: train log has no epochs")
    return epochs


def check_metrics(metrics: dict[str, Any], where: str) -> None:
    """Check the metric keys of ``metrics.json`` (or one of its baselines)."""
    for key in METRIC_KEYS:
        value = metrics.get(key)
        if not (isinstance(value, dict) and _is_number(value.get("mean"))
                and _is_number(value.get("stderr"))):
            raise VaecfError(f"{where}: '{key}' must be {{\"mean\": number, \"stderr\": number}}")


def read_metrics(uri: str) -> dict[str, Any]:
    """``metrics.json`` of ``vaecf evaluate``, checked (baselines included)."""
    metrics = read_json(uri)
    check_metrics(metrics, uri)
    baselines = metrics.get("baselines", {})
    if not isinstance(baselines, dict):
        raise VaecfError(f"{uri}: 'baselines' must be an object")
    for name, values in baselines.items():
        if not isinstance(values, dict):
            raise VaecfError(f"{uri}: baselines.{name} must be an object")
        check_metrics(values, f"{uri}: baselines.{name}")
    return metrics


def read_benchmark(uri: str) -> dict[str, Any]:
    """``benchmark.json`` of ``vaecf benchmark``, checked."""
    bench = read_json(uri)
    for key in ("runs", "configs"):
        if not isinstance(bench.get(key), list):
            raise VaecfError(f"{uri}: '{key}' must be a list")
    for number, config in enumerate(bench["configs"]):
        if not isinstance(config, dict) or any(k not in config for k in RUN_KEYS):
            raise VaecfError(f"{uri}: configs[{number}] needs {', '.join(RUN_KEYS)}")
    return bench


def read_manifests(uris: list[str]) -> dict[str, dict[str, Any]]:
    """Every ``<stage>_manifest.json`` in the given directories (verified) or files, by stage."""
    found: dict[str, dict[str, Any]] = {}
    for uri in uris:
        if uri.endswith("_manifest.json"):
            manifest = read_json(uri)
            found[str(manifest.get("stage", Path(uri).name[:-len("_manifest.json")]))] = manifest
            continue
        with open_input(uri) as directory:
            names = sorted(directory.glob("*_manifest.json"))
            if not names:
                raise VaecfError(f"{uri}: no *_manifest.json in this directory")
            for path in names:
                stage = path.name[:-len("_manifest.json")]
                found[stage] = read_manifest(directory, stage)
    return found


def load_inputs(*, train_log: str | None, metrics: str | None, benchmark: str | None,
                manifests: list[str] | None, reference: str | None = None,
                trials: str | None = None) -> ReportInputs:
    """Read every given input; raise ``VaecfError`` naming the first malformed one."""
    return ReportInputs(
        train_log=read_train_log(train_log) if train_log else None,
        metrics=read_metrics(metrics) if metrics else None,
        benchmark=read_benchmark(benchmark) if benchmark else None,
        reference=read_benchmark(reference) if reference else None,
        trials=read_trials(trials) if trials else None,
        manifests=read_manifests(manifests or []),
        sources={"train_log": train_log, "metrics": metrics, "benchmark": benchmark,
                 "reference": reference, "manifests": list(manifests or []),
                 "trials": trials},
    )
