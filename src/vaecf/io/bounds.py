"""Every numeric flag of every stage, with the range of values that mean something: one table.

As every flag that names a location is registered by its role (``vaecf.io.roles``), every
flag that takes a number has its bounds here, keyed by the flag (``"--epochs"``) or, where
one name means different things in different stages, by ``"<stage> <flag>"`` (which wins).
``run_stage`` checks each parsed number against its entry before the stage's body runs, so
``--alternate 1000000000000000000`` or ``--kl-per-item 1e308`` stop at once with one line,
never a ``MemoryError`` or an overflow deep in training. The argparse types keep their
finer checks (``> 0``, finite); this table adds what a type alone does not know: how large
a value can meaningfully be. A stage test walks every parser of ``vaecf.cli`` and fails on a
numeric flag without an entry, so a flag added later gets one. A search space of ``vaecf
tune`` takes its largest values from here too (``vaecf.tuning.space``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeGuard

from vaecf.errors import VaecfError

# Seeds feed numpy's and Keras' global seeding (``np.random.seed`` takes 0 .. 2**32 - 1) and
# the trainer adds the Horovod rank: 0 .. 2**31 - 1 leaves room for any world size.
MAX_SEED = 2**31 - 1
# Users, items, rows and steps are counted in int32 indices (scipy's CSR, TensorFlow's
# shapes and the item index of a SavedModel).
COUNT = 2**31 - 1
EPOCHS = 10**6  # an epoch is a pass over every training user
PROCESSES = 65536  # Horovod ranks, hosts or shares of the users
FLOAT32_MAX = 3.4028234663852886e38
DAY = 86400.0
YEAR = 365 * DAY
# Training steps in one call at most (--steps-per-call; ``vaecf.train.calls``): the rows of
# the statistics buffer each call returns (5 float32 per step).
STEPS_PER_CALL = 1024


@dataclass(frozen=True)
class Bound:
    """The meaningful values of a numeric flag: ``low`` to ``high``, both included.

    Attributes:
      why: what ``high`` is, shown when a value lies outside.
    """

    low: float
    high: float
    why: str


BOUNDS: dict[str, Bound] = {
    "--seed": Bound(0, MAX_SEED, "numpy's and Keras' seeds, plus a rank"),
    # data: download, preprocess, split, demo, benchmark
    "--synthetic-users": Bound(1, COUNT, "int32 user indices"),
    "--synthetic-items": Bound(1, COUNT, "int32 item indices"),
    "--users": Bound(1, COUNT, "int32 user indices"),
    "--items": Bound(1, COUNT, "int32 item indices"),
    "--min-rating": Bound(-1e9, 1e9, "ratings are small numbers"),
    "--min-user-items": Bound(0, COUNT, "a user has at most every item"),
    "--min-item-users": Bound(0, COUNT, "an item has at most every user"),
    "--min-plays": Bound(0, 2**63 - 1, "int64 play counts"),
    "--val-fraction": Bound(0, 1, "a share of the users"),
    "--test-fraction": Bound(0, 1, "a share of the users"),
    "--holdout-fraction": Bound(0, 1, "a share of a user's items"),
    "--heldout-users": Bound(1, COUNT, "int32 user indices"),
    # training: train, tune, demo, benchmark, launch-mpijob
    "--epochs": Bound(1, EPOCHS, "a million passes over the users"),
    "--patience": Bound(1, EPOCHS, "a million passes over the users"),
    "--max-epochs": Bound(1, EPOCHS, "a million passes over the users"),
    "--steps-per-call": Bound(0, STEPS_PER_CALL, "the rows of a call's statistics buffer"),
    "--batch-size": Bound(1, COUNT, "int32 user indices"),
    "--batch-sizes": Bound(1, COUNT, "int32 user indices"),
    "--batch-per-rank": Bound(1, COUNT, "int32 user indices"),
    "--learning-rate": Bound(0, FLOAT32_MAX, "float32's largest, the optimizer's"),
    "--beta-cap": Bound(0, 1000, "a KL weight (the paper's cap: 0.2)"),
    "--anneal-steps": Bound(0, COUNT, "int32 step counts"),
    "--dropout": Bound(0, 1, "a rate"),
    # a layer's width: int32 shapes; the model's size is checked against memory at the start
    "--hidden": Bound(1, COUNT, "int32 shapes"),
    "--latent": Bound(1, COUNT, "int32 shapes"),
    "--l2": Bound(0, 1e6, "a weight penalty"),
    "--validate-every": Bound(1, EPOCHS, "epochs"),
    "--checkpoint-interval": Bound(0, YEAR, "a year"),
    "--checkpoint-every": Bound(1, EPOCHS, "epochs"),
    "--steps-per-epoch": Bound(1, COUNT, "int32 step counts"),
    "--steps": Bound(1, COUNT, "int32 step counts"),
    "--item-chunk": Bound(0, COUNT, "int32 item indices"),
    "--user-shares": Bound(1, PROCESSES, "processes"),
    "--expect-world-size": Bound(1, PROCESSES, "processes"),
    "--expect-hosts": Bound(1, PROCESSES, "hosts"),
    "--world-sizes": Bound(1, PROCESSES, "processes"),
    "--kl-per-item": Bound(0, 100, "a KL weight per item (RecVAE: 0.005)"),
    "--alternate": Bound(0, 100, "encoder passes per epoch (RecVAE: 3)"),
    "--encoder-layers": Bound(1, 64, "dense layers (RecVAE: 5)"),
    "--implicit-slim-every": Bound(0, EPOCHS, "epochs"),
    "--implicit-slim-lambda": Bound(0, 1e12, "a ridge penalty (its square stays finite)"),
    "--implicit-slim-alpha": Bound(0, 1e6, "a scale of the embedding update"),
    "--implicit-slim-threshold": Bound(0, COUNT, "an item has at most every user"),
    "--repeats": Bound(1, 1000, "repeats of each configuration"),
    "--target-ndcg": Bound(0, 1, "NDCG@100 lies in [0, 1]"),
    "--trials": Bound(1, 10000, "trials of one search"),
    # evaluate, recommend
    "--batch-users": Bound(1, COUNT, "int32 user indices"),
    "--export-top-k": Bound(1, COUNT, "int32 item indices"),
    "--top-k": Bound(1, COUNT, "int32 item indices"),
    "--ease-lambda": Bound(0, 1e12, "a ridge penalty"),
    # Kubernetes launchers (their renderers check the finer limits)
    "--gpus-per-worker": Bound(0, 64, "GPUs of one node"),
    "--slots-per-worker": Bound(1, 64, "ranks of one node"),
    "--executors": Bound(1, 1000, "executor pods"),
    "--executor-cores": Bound(1, 64, "cores of one node"),
    "--driver-cores": Bound(1, 64, "cores of one node"),
    "--timeout": Bound(0, YEAR, "a year"),
    "--request-timeout": Bound(0, DAY, "a day"),
    "launch-mpijob --workers": Bound(1, 1024, "MPIJob workers"),
    "launch-mpijob --epochs": Bound(0, EPOCHS, "a million passes over the users; 0: stop "
                                    "early, as train does without --epochs"),
    "demo --workers": Bound(1, 1024, "Horovod processes"),
    # serve, benchmark-serve
    "--http_port": Bound(1, 65535, "TCP ports"),
    "--grpc_port": Bound(1, 65535, "TCP ports"),
    "serve --workers": Bound(1, 1024, "worker processes"),
    "--max_threads": Bound(1, 4096, "threads"),
    "--grace-period": Bound(1, DAY, "a day"),
    "--max-batch-users": Bound(1, 2**20, "users in one model call"),
    "--max-header-bytes": Bound(1, 2**24, "16 MiB of headers"),
    "--clients": Bound(1, 10000, "concurrent clients"),
    "--users-per-request": Bound(1, 2**20, "users in one request"),
    "--seconds": Bound(0, 3600, "an hour per scenario"),
    "--items-per-user": Bound(1, COUNT, "int32 item indices"),
}


def bound(stage: str, flag: str) -> Bound | None:
    """The entry of ``flag`` of ``vaecf <stage>``: its stage's own, else the flag's."""
    return BOUNDS.get(f"{stage} {flag}", BOUNDS.get(flag))


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def numeric_flags(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str]]:
    """(flag, dest) of every flag of ``parser`` that takes a number (its type makes "1" one)."""
    for action in parser._actions:  # argparse keeps its flags nowhere public
        if not action.option_strings or action.nargs == 0 or not callable(action.type):
            continue
        try:
            sample = action.type("1")
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            continue
        if _number(sample):
            yield action.option_strings[-1], action.dest


def check_bounds(stage: str, parser: argparse.ArgumentParser, args: Any) -> None:
    """Refuse, in one line, a number given to a flag of ``vaecf <stage>`` outside its bounds."""
    for flag, dest in numeric_flags(parser):
        entry = bound(stage, flag)
        if entry is None:
            continue
        value = getattr(args, dest, None)
        for number in value if isinstance(value, list | tuple) else [value]:
            if not _number(number):
                continue
            if not (math.isfinite(number) and entry.low <= number <= entry.high):
                raise VaecfError(f"{flag} {number}: expected {_shown(entry.low)}.."
                                 f"{_shown(entry.high)} (the upper bound: {entry.why})")


def _shown(value: float) -> str:
    whole = float(value).is_integer() and abs(value) < 1e15
    return f"{int(value)}" if whole else f"{value:g}"
