"""The trial record, shared by ``vaecf tune``, the KFP sweep's fan-in and the report.

``trials.jsonl`` holds one JSON object per trial, in trial order (numbered from 0)::

    {"trial": 3, "params": {"beta_cap": 0.4, ...}, "val": {"ndcg_at_100": 0.41, ...},
     "val_stderr": {"ndcg_at_100": 0.012, ...}, "best_epoch": 17, "epochs": 100,
     "beta_at_best_epoch": 0.068, "model": "trials/trial-003", "best": false}

``params`` are every searchable hyperparameter as the trial's ``train_manifest.json``
recorded it (``anneal_steps`` as resolved for the run), so a record is complete whatever was
searched; ``val`` the validation metrics of the exported model and ``val_stderr`` their
standard errors (None where the trial's training did not record them). ``beta_at_best_epoch``
is the KL weight the exported epoch trained with: with annealing and best-epoch export, a
trial whose best epoch is 19 of 100 used a fifth of its ``beta_cap`` (None under
``--kl-per-item``, whose weight is per user).

The candidate (``best_of``): the highest validation NDCG@100, unless trials within one
standard error of it are simpler -- fewer of RecVAE's options on, then fewer epochs, then
narrower layers -- in which case the simplest of those (the one-standard-error rule: a lead
within noise does not pay for the complexity). The standard error is that of the paired
difference to the highest (per-user NDCG@100 on the same validation users); a record read
without its per-user scores (the report of an older tune) falls back on the highest trial's
own standard error, two to three times larger.

The choice (``choose``, ``CHOICE_RULE``): trial 0 is the reference (``vaecf tune`` puts
``vaecf train``'s defaults there, ``vaecf.tuning.space.search``; so does the KFP sweep's
default list). The candidate replaces it only when its lead over the reference on the
validation users is larger than the paired standard error of that lead (per-user differences
of NDCG@100 on the same users): a search can then not hand back a trial that merely won a
draw among many. Only the chosen trial is evaluated on the test users.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from vaecf import log
from vaecf.errors import VaecfError
from vaecf.io import open_input, read_jsonl, read_manifest
from vaecf.io.readers import read_json
from vaecf.metrics.reference import paired_difference
from vaecf.train.tracking import VAL_KEYS
from vaecf.tuning.space import SEARCHABLE, options_on

OBJECTIVE = VAL_KEYS[0]


def record(index: int, model: str, train_manifest: Mapping[str, Any],
           val: Mapping[str, Any]) -> dict[str, Any]:
    """One trial's record from its train manifest and its validation metrics.

    Args:
      val: metric key -> mean (the trainer's ``best_val``) or -> {"mean", "stderr"} (a
        ``metrics.json`` of ``vaecf evaluate --subset val``).
    """
    parameters = train_manifest.get("parameters") or {}
    values, errors = {}, {}
    recorded = train_manifest.get("best_val_stderr") or {}
    for key in VAL_KEYS:
        value = val.get(key)
        error = value.get("stderr") if isinstance(value, dict) else recorded.get(key)
        value = value.get("mean") if isinstance(value, dict) else value
        if not (isinstance(value, int | float) and math.isfinite(value)):
            raise VaecfError(f"trial {index} ({model}): no validation {key}")
        values[key] = float(value)
        errors[key] = float(error) if isinstance(error, int | float) else None
    return {"trial": index, "params": {k: parameters.get(k) for k in SEARCHABLE},
            "val": values, "val_stderr": errors, "best_epoch": train_manifest.get("best_epoch"),
            "epochs": (train_manifest.get("counts") or {}).get("epochs"),
            "beta_at_best_epoch": beta_at_best_epoch(train_manifest), "model": model}


def exported_val(train_manifest: Mapping[str, Any]) -> Mapping[str, Any]:
    """The exported model's validation metrics, as ``record`` takes them: with EASE blended
    in (``ease_blend``'s ``val`` and ``val_stderr``), else the best epoch's (``best_val``)."""
    blended = train_manifest.get("ease_blend") or {}
    if "val" not in blended:
        return train_manifest["best_val"]
    errors = blended.get("val_stderr") or {}
    return {key: {"mean": value, "stderr": errors.get(key)}
            for key, value in blended["val"].items()}


def beta_at_best_epoch(train_manifest: Mapping[str, Any]) -> float | None:
    """The KL weight at the last step of the exported epoch (``min(cap, step / anneal)``),
    None when unknown or per user (``--kl-per-item``)."""
    parameters = train_manifest.get("parameters") or {}
    counts = train_manifest.get("counts") or {}
    best, cap = train_manifest.get("best_epoch"), parameters.get("beta_cap")
    anneal, steps, epochs = (parameters.get("anneal_steps"), counts.get("steps"),
                             counts.get("epochs"))
    numbers = [v for v in (best, cap, anneal, steps, epochs) if isinstance(v, int | float)]
    if parameters.get("kl_per_item") is not None or len(numbers) < 5 or not epochs:
        return None
    best, cap, anneal, steps, epochs = (float(v) for v in numbers)
    if anneal <= 0:
        return cap
    return min(cap, (best * steps / epochs - 1) / anneal)


def collect(models: list[str], evaluations: list[str], stack: ExitStack
            ) -> list[dict[str, Any]]:
    """Records of trials trained elsewhere (the KFP sweep), each model with its evaluation.

    An evaluation's manifest names the model it scored; where those names are the given
    models (KFP mounts an artifact at the same path in every step), they pair the two lists
    whatever their order, else the lists pair in order.
    """
    if len(models) != len(evaluations):
        raise VaecfError(f"--collect-models ({len(models)}) and --collect-evaluations "
                         f"({len(evaluations)}) must pair up one to one")
    scored: list[tuple[str, dict[str, Any]]] = []
    for evaluation in evaluations:
        directory = stack.enter_context(open_input(evaluation))
        manifest = read_manifest(directory, "evaluate", required=["metrics.json"])
        metrics = read_json(directory / "metrics.json", f"{evaluation}/metrics.json")
        if metrics.get("subset") != "val":
            raise VaecfError(f"{evaluation}: evaluated on '{metrics.get('subset')}' users; "
                             "trials are compared on validation users only")
        scored.append((str(manifest["inputs"].get("model")), metrics))
    by_path = sorted(path for path, _ in scored) == sorted(set(models))
    if not by_path:
        log.warning("vaecf tune: warning: the evaluations name other model paths than "
                    "--collect-models; pairing the two lists in order")
    ordered = [dict(scored)[m] for m in models] if by_path else [m for _, m in scored]
    return [record(index, model, read_manifest(stack.enter_context(open_input(model)), "train"),
                   metrics) for index, (model, metrics) in enumerate(zip(models, ordered,
                                                                        strict=True))]


CHOICE_RULE = ("trial 0 (train's defaults) is kept unless the best trial by validation "
               "NDCG@100 (the simplest within one paired standard error of the highest) leads "
               "it on "
               "the validation users by more than the paired standard error of that lead")

# One trial's per-user validation NDCG@100, in the users' order (the same for every trial).
PerUser = Callable[[dict[str, Any]], np.ndarray]


def choose(records: list[dict[str, Any]], per_user: PerUser
           ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Flag the chosen trial (module docstring) and return it with the decision's record:
    the rule, the reference and the candidate, and their paired comparison on the validation
    users (``paired_difference``: candidate minus reference) when they differ."""
    if not records:
        raise VaecfError("no trials to choose from")
    scores: dict[int, np.ndarray] = {}

    def cached(entry: dict[str, Any]) -> np.ndarray:  # each trial's model scored once
        key = id(entry)
        if key not in scores:
            scores[key] = per_user(entry)
        return scores[key]

    reference = records[0]
    # The reference at the top: whatever is within noise of it cannot lead it.
    candidate = reference if _top(records) is reference else best_of(records, cached)
    decision: dict[str, Any] = {"rule": CHOICE_RULE, "reference": reference.get("trial", 0),
                                "candidate": candidate.get("trial", 0), "paired": None}
    chosen = reference
    if candidate is not reference:
        paired = paired_difference(cached(candidate), cached(reference))
        decision["paired"] = paired
        if paired["delta"] > paired["stderr"]:  # type: ignore[operator]
            chosen = candidate
    decision["chosen"] = chosen.get("trial", 0)
    for entry in records:
        entry["best"] = entry is chosen
    return chosen, decision


def val_per_user(split: Any, model_dir: Path) -> np.ndarray:
    """float64 (validation users evaluated,): each one's NDCG@100 under the exported model
    at ``model_dir``, scored as ``vaecf evaluate --subset val`` scores it."""
    from vaecf.metrics import evaluate
    from vaecf.metrics.model_scorer import SavedModelScorer

    scorer = SavedModelScorer(model_dir, split.n_items, split.digest, split.train)
    return np.asarray(evaluate(scorer, *split.heldout("val")).per_user[OBJECTIVE])


def describe_choice(decision: dict[str, Any]) -> str:
    """The decision in words, for the log and the report."""
    paired, reference = decision.get("paired"), decision["reference"]
    if paired is None:
        return f"trial {reference} (the reference) is also the best by validation"
    lead = (f"trial {decision['candidate']} minus trial {reference}: {paired['delta']:+.4f} +- "
            f"{paired['stderr']:.4f} (paired, {paired['users']} validation users)")
    if decision["chosen"] == reference:
        return f"{lead}, not more than its standard error: the reference trial {reference} is kept"
    return f"{lead}, more than its standard error: trial {decision['candidate']} replaces it"


def best_of(records: list[dict[str, Any]], per_user: PerUser | None = None
            ) -> dict[str, Any]:
    """The candidate (module docstring): the highest validation NDCG@100, or the simplest
    trial within one standard error of it (paired, with ``per_user``); the lowest number of
    equals."""
    top = _top(records)

    def noise(entry: dict[str, Any]) -> float:
        if per_user is None:
            return (top.get("val_stderr") or {}).get(OBJECTIVE) or 0.0
        return float(paired_difference(per_user(top), per_user(entry))["stderr"] or 0.0)

    close = [r for r in records if r is top
             or r["val"][OBJECTIVE] >= top["val"][OBJECTIVE] - noise(r)]
    return min(close, key=lambda r: (*simplicity(r.get("params") or {}), -r["val"][OBJECTIVE],
                                     r.get("trial", 0)))


def _top(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The highest validation NDCG@100, the lowest number of equals."""
    return max(records, key=lambda r: (r["val"][OBJECTIVE], -r.get("trial", 0)))


def simplicity(params: Mapping[str, Any]) -> tuple[float, ...]:
    """What "simpler" compares: options on, epochs, hidden and latent width (smaller first)."""
    def number(name: str) -> float:
        value = params.get(name)
        return float(value) if isinstance(value, int | float) else 0.0

    return (options_on(params), number("epochs"), number("hidden"), number("latent"))


def write_trials(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def _finite(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def read_trials(uri: str) -> list[dict[str, Any]]:
    """``trials.jsonl``, checked: every line a trial with params and validation metrics."""
    found = []
    for number, entry in read_jsonl(uri):
        ok = (isinstance(entry, dict) and isinstance(entry.get("params"), dict)
              and isinstance(entry.get("val"), dict)
              and all(_finite(entry["val"].get(k)) for k in VAL_KEYS))
        if not ok:
            raise VaecfError(f"{uri}: line {number}: expected a trial with 'params' and "
                             f"'val' ({', '.join(VAL_KEYS)}, finite numbers)")
        errors = entry.get("val_stderr") or {}
        if not (isinstance(errors, dict) and all(
                errors.get(k) is None or (_finite(errors[k]) and errors[k] >= 0)
                for k in VAL_KEYS)):
            raise VaecfError(f"{uri}: line {number}: 'val_stderr': expected finite numbers "
                             ">= 0 or null")
        found.append(entry)
    if not found:
        raise VaecfError(f"{uri}: no trials")
    return found
