"""The search space of ``vaecf tune``, the KFP sweep and the Katib Experiment, and its trials.

A space maps each searched ``vaecf train`` hyperparameter to its candidate values; a trial is
one value per hyperparameter. The trials are the whole grid when it is small enough, else a
seeded random sample of it without repeats, so the same (space, trials, seed) always gives the
same list, on a laptop and in the compiled sweep alike. Grid and random search over a few
discrete values are what a handful of trials can afford; a model-based search (Optuna's TPE,
Katib's Bayesian suggestion) needs tens of trials before it beats random.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from vaecf.errors import VaecfError
from vaecf.io.bounds import bound


def _searchable(flag: str, kind: type, low: float) -> tuple[str, type, float, float]:
    """A hyperparameter's entry: its largest value is its flag's (``vaecf.io.bounds``, the
    one table), so a space never holds a value ``vaecf train`` would refuse."""
    entry = bound("train", flag)
    if entry is None:
        raise LookupError(f"{flag}: not in vaecf.io.bounds.BOUNDS")
    return flag, kind, low, entry.high


# Searchable hyperparameter -> (``vaecf train`` flag, type, smallest and largest allowed
# value). The largest keep every value a number that training can hold (an epoch count of
# 1e300 is no count of epochs).
SEARCHABLE: dict[str, tuple[str, type, float, float]] = {
    "beta_cap": _searchable("--beta-cap", float, 0.0),
    "anneal_steps": _searchable("--anneal-steps", int, 0),
    "learning_rate": _searchable("--learning-rate", float, 1e-12),
    "dropout": _searchable("--dropout", float, 0.0), "epochs": _searchable("--epochs", int, 1),
    "hidden": _searchable("--hidden", int, 1), "latent": _searchable("--latent", int, 1),
    # RecVAE's options and ImplicitSLIM's step (off: null, false, 0, 1 and 0)
    "kl_per_item": _searchable("--kl-per-item", float, 1e-12),
    "composite_prior": ("--composite-prior", bool, 0.0, 1.0),
    "alternate": _searchable("--alternate", int, 0),
    "encoder_layers": _searchable("--encoder-layers", int, 1),
    "implicit_slim_every": _searchable("--implicit-slim-every", int, 0)}
NULLABLE = ("anneal_steps", "kl_per_item", "epochs")  # epochs null: stop early (train's default)
# Each option's value where it is off (``options_on`` counts the others: "simpler" trials).
OFF: dict[str, Any] = {"kl_per_item": None, "composite_prior": False, "alternate": 0,
                       "encoder_layers": 1, "implicit_slim_every": 0}
# The most points a grid may have (its size is computed before anything is expanded), and
# the most bytes of a space given as a file (``--space @file``).
GRID_LIMIT = 10**6
SPACE_LIMIT = 1024 * 1024
# The default space: an 8-point grid that `vaecf tune --trials 8` (its default) takes whole,
# one of whose points is `vaecf train`'s defaults (the reference, ``search``). Every trial
# stops early as train does without --epochs (the old grid's fixed 50 epochs and
# dropout 0.3 never held train's own settings, and on an ML-1M derivative train's defaults
# beat all 8 of its trials). What the CiteULike-a and ML-1M >= 3 measurements (docs/results/
# accuracy.md) say still moves the result: the width and the learning rate (train's defaults are
# now the wider model at the lower rate; the grid keeps the paper's 600 and 1e-3 beside them), and
# RecVAE's per-item KL weight (within noise on CiteULike-a, +0.013 on ML-1M >= 3). The five-layer
# encoder is the default (not searched: better everywhere measured); ImplicitSLIM's step stays
# out: it helps on ML-1M >= 3 (+0.011) and loses on CiteULike-a (-0.085).
DEFAULT_SPACE: dict[str, list[Any]] = {
    "hidden": [600, 1200], "learning_rate": [5e-4, 1e-3], "kl_per_item": [None, 0.005]}


def train_defaults() -> dict[str, Any]:
    """``vaecf train``'s value of every searchable hyperparameter (``TrainConfig``'s)."""
    from dataclasses import fields

    from vaecf.train.config import TrainConfig

    return {f.name: f.default for f in fields(TrainConfig) if f.name in SEARCHABLE}


def search(space: Mapping[str, list[Any]], count: int, seed: int,
           where: str = "--space") -> list[dict[str, Any]]:
    """What ``vaecf tune`` trains: the reference trial first (``vaecf train``'s defaults for
    every name of ``space``: the trial a search must beat to replace), then ``count - 1``
    further distinct trials of ``trials(space, count, seed)``."""
    if count < 1:
        raise VaecfError(f"--trials: expected >= 1, got {count}")
    defaults = train_defaults()
    reference = check_trial({name: defaults[name] for name in space}, "train's defaults")
    others = [t for t in trials(space, count, seed, where) if t != reference]
    return [reference, *others[:count - 1]]


def check_trial(trial: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A trial's values, checked: known names, numbers of the right kind and range."""
    checked: dict[str, Any] = {}
    for name, value in trial.items():
        if name not in SEARCHABLE:
            raise VaecfError(f"{where}: unknown hyperparameter '{name}' (one of: "
                             f"{', '.join(SEARCHABLE)})")
        _, kind, low, high = SEARCHABLE[name]
        if value is None and name in NULLABLE:
            checked[name] = None
            continue
        if kind is bool:
            if not isinstance(value, bool):
                raise VaecfError(f"{where}: {name} {value!r}: expected true or false")
            checked[name] = value
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not (number and math.isfinite(value) and low <= value <= high
                and (kind is float or float(value).is_integer())
                and (name != "dropout" or value < 1.0)):
            what = "an integer" if kind is int else "a number"
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
            bound = "< 1" if name == "dropout" else f"<= {high:g}"
            raise VaecfError(f"{where}: {name} {shown}: expected {what} >= {low:g} and "
                             f"{bound}")
        checked[name] = kind(value)
    return checked


def parse_trial(text: str, where: str) -> dict[str, Any]:
    """A trial from its JSON text (a KFP loop item, a Katib parameter set, a flag)."""
    try:
        trial = json.loads(text)
    except ValueError as err:
        raise VaecfError(f"{where}: not valid JSON ({err})") from None
    if not isinstance(trial, dict):
        raise VaecfError(f"{where}: expected a JSON object of hyperparameters")
    return check_trial(trial, where)


def train_flags(trial: Mapping[str, Any]) -> list[str]:
    """The ``vaecf train`` flags of a checked trial (null or false: no flag)."""
    flags: list[str] = []
    for name, value in trial.items():
        if value is True:
            flags.append(SEARCHABLE[name][0])
        elif value is not None and value is not False:
            flags += [SEARCHABLE[name][0], str(value)]
    return flags


def options_on(params: Mapping[str, Any]) -> int:
    """How many of RecVAE's options and ImplicitSLIM's step a trial turns on."""
    return sum(params.get(name, off) != off for name, off in OFF.items())


def describe(trial: Mapping[str, Any]) -> str:
    """``beta_cap=0.2, anneal_steps=null``: a trial's values as the space writes them."""
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in trial.items())


def load_space(text: str, where: str) -> dict[str, list[Any]]:
    """A space from JSON: ``{"beta_cap": [0.1, 0.2], ...}``, every value list non-empty."""
    try:
        space = json.loads(text)
    except ValueError as err:
        raise VaecfError(f"{where}: not valid JSON ({err})") from None
    if not isinstance(space, dict) or not space:
        raise VaecfError(f"{where}: expected a JSON object of hyperparameter -> list of values")
    for name, values in space.items():
        if not isinstance(values, list) or not values:
            raise VaecfError(f"{where}: {name}: expected a non-empty list of values")
        for value in values:
            check_trial({name: value}, where)
    return {name: list(values) for name, values in space.items()}


def trials(space: Mapping[str, list[Any]], count: int, seed: int,
           where: str = "--space") -> list[dict[str, Any]]:
    """``count`` distinct trials: the whole grid in order if it has at most ``count``
    points, else a random sample of the grid drawn with ``seed``."""
    if count < 1:
        raise VaecfError(f"--trials: expected >= 1, got {count}")
    names = list(space)
    size = math.prod(len(space[name]) for name in names)
    if size > GRID_LIMIT:
        raise VaecfError(f"{where}: a grid of {size:,} points (at most {GRID_LIMIT:,}); search "
                         "fewer values")
    points: list[int] | range = range(size)
    if size > count:
        points = sorted(int(i) for i in np.random.default_rng(seed).choice(size, size=count,
                                                                           replace=False))
    return [check_trial(dict(zip(names, _point(space, names, index), strict=True)), "space")
            for index in points]


def _point(space: Mapping[str, list[Any]], names: list[str], index: int) -> list[Any]:
    """The ``index``-th point of the grid in ``itertools.product`` order (the last name
    varies fastest), without expanding the grid."""
    point = []
    for name in reversed(names):
        index, digit = divmod(index, len(space[name]))
        point.append(space[name][digit])
    return point[::-1]
