"""The pipeline's report step's KFP side (its CLI: ``python -m vaecf.stages.kfp_report``).

The step runs ``vaecf report`` with the flags after ``--``, then fills its typed artifacts:
``report.md`` into the Markdown artifact, ``report.html`` into the HTML artifact, and the
evaluation's scalars onto the ``system.Metrics`` artifact. KFP v2 reads an artifact's metrics
from its metadata, which a container reports in the executor output file named by the executor
input (``{{$}}``), the same channel ``Metrics.log_metric`` uses in Python components; that is
what the run page's metrics view and the run-compare page show.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vaecf.errors import VaecfError

METRIC_KEYS = ("recall_at_20", "recall_at_50", "ndcg_at_100")


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """Flat name -> number of ``metrics.json`` (vaecf evaluate): means, stderrs, user counts,
    and each baseline's means prefixed by its name (``popularity_ndcg_at_100``)."""
    scalars: dict[str, float] = {}
    for key in METRIC_KEYS:
        if key in metrics:
            scalars[key] = float(metrics[key]["mean"])
            scalars[f"{key}_stderr"] = float(metrics[key]["stderr"])
    for count in ("users_evaluated", "users_skipped"):
        if count in metrics:
            scalars[count] = float(metrics[count])
    for baseline, values in sorted((metrics.get("baselines") or {}).items()):
        for key in METRIC_KEYS:
            if key in values:
                scalars[f"{baseline}_{key}"] = float(values[key]["mean"])
    return scalars


def metrics_output(executor_input: dict[str, Any], artifact: str
                   ) -> tuple[dict[str, Any], Path]:
    """The output ``artifact``'s entry and the executor output file, from the executor input."""
    try:
        outputs = executor_input["outputs"]
        entry = dict(outputs["artifacts"][artifact]["artifacts"][0])
        return entry, Path(outputs["outputFile"])
    except (KeyError, IndexError, TypeError) as err:
        raise VaecfError(f"--executor-input: no output artifact {artifact!r} or outputFile "
                         f"({err})") from err


def write_executor_output(path: Path, artifact: str, entry: dict[str, Any],
                          scalars: dict[str, float]) -> None:
    """Record ``scalars`` as the metadata of output ``artifact`` in KFP's executor output."""
    entry = {**entry, "metadata": {**(entry.get("metadata") or {}), **scalars}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"artifacts": {artifact: {"artifacts": [entry]}}}, indent=2))
