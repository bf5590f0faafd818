"""Tuning: every trial of a search (``trials.jsonl``), as a table and a plot, and the verdict.

Trials are compared on the validation users only; the best one's test metrics are the
report's accuracy section (``--metrics`` of ``vaecf tune``'s ``test/metrics.json``), so the
test users judge one model, never the choice among many.
"""

from __future__ import annotations

import json
from typing import Any

from vaecf.report import plots
from vaecf.report.document import Figure, Section, Table, fmt
from vaecf.tuning.trials import CHOICE_RULE, OBJECTIVE, VAL_KEYS, best_of

LABELS = {"ndcg_at_100": "val NDCG@100", "recall_at_20": "val Recall@20",
          "recall_at_50": "val Recall@50"}


def analyse(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """The trials as recorded, the searched names (values that differ) and the best trial."""
    names = sorted({k for t in trials for k in t["params"]})
    searched = [k for k in names if len({repr(t["params"].get(k)) for t in trials}) > 1]
    # the trial the tune chose (flagged in trials.jsonl), else the rule's candidate
    best = next((t for t in trials if t.get("best")), None) or best_of(trials)
    return {"trials": trials, "searched": searched, "best": best}


def verdict(tuning: dict[str, Any]) -> list[str]:
    best, trials = tuning["best"], tuning["trials"]
    values = [t["val"][OBJECTIVE] for t in trials]
    settings = ", ".join(f"{k} {json.dumps(best['params'].get(k))}" for k in tuning["searched"])
    return [f"Tuning: the chosen of {len(trials)} trials is trial "
            f"{best.get('trial')} ({settings or 'no setting varied'}): "
            f"{_with_error(best, OBJECTIVE)}; the highest {fmt(max(values))}, the worst "
            f"{fmt(min(values))} (chosen: {CHOICE_RULE}); only the chosen trial was evaluated "
            "on the test users."]


def _with_error(trial: dict[str, Any], key: str) -> str:
    error = (trial.get("val_stderr") or {}).get(key)
    return fmt(trial["val"][key]) + ("" if error is None else f" ± {fmt(error)}")


def _kept(trial: dict[str, Any]) -> str:
    """The kept (exported) epoch of the trial's epochs, and the KL weight it trained with."""
    epochs = f" of {trial['epochs']}" if trial.get("epochs") else ""
    beta = trial.get("beta_at_best_epoch")
    return (f"{trial.get('best_epoch')}{epochs}"
            + ("" if beta is None else f" (beta {beta:.3g})"))


def section(tuning: dict[str, Any]) -> Section:
    """A row per trial (searched settings, validation metrics with their standard errors,
    the kept epoch and its KL weight) and a bar per trial."""
    searched, trials = tuning["searched"], tuning["trials"]
    rows = [[str(t.get("trial")) + (" (best)" if t is tuning["best"] else ""),
             *[json.dumps(t["params"].get(k)) for k in searched],
             *[_with_error(t, k) for k in VAL_KEYS], _kept(t)]
            for t in trials]
    table = Table(["trial", *searched, *[LABELS[k] for k in VAL_KEYS],
                   "kept epoch (beta there)"], rows)
    labels = [str(t.get("trial")) for t in trials]
    png = plots.bars("Validation NDCG@100 per trial", "NDCG@100", labels,
                     [t["val"][OBJECTIVE] for t in trials])
    return Section("Tuning", [f"{len(trials)} trials; searched: "
                              f"{', '.join(searched) or 'nothing varied'}.", table,
                              Figure("Validation NDCG@100 of every trial", png)])
