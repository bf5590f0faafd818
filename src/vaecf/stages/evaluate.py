"""``vaecf evaluate``: Recall@20, Recall@50 and NDCG@100 of a trained model or a baseline.

Reads a split (``vaecf split``) and a model (``vaecf train`` output, or ``popularity`` /
``ease``), evaluates the ``--subset`` users through ``vaecf.metrics.evaluate`` (batched
TensorFlow, on GPU when there is one) and publishes ``metrics.json``, optionally
``top_k.parquet`` (``--export-top-k``), and ``evaluate_manifest.json``. Everything but
``users_per_second`` and ``timing`` in ``metrics.json`` is a pure function of the inputs and
flags. Each baseline in ``metrics.json`` carries ``paired``: per metric, the model minus the
baseline on the same users (``test``, ``users``, ``delta``, ``stderr``, ``z``), computed here
where the per-user values are, so that ``vaecf report`` judges differences with a paired test
without a per-user file. ``users_per_second`` is the steady rate, from the whole chunks after
the first (null, said so in ``timing.steady_rate``, when there is none: a rate made of start-up
or of a partial chunk's fixed cost would mislead); ``timing`` has the start-up apart from it:
the process before the stage (Python, TensorFlow import), loading the split and the model, and
the first chunk (which traces the scorer and the ranking), and the partial last chunk apart
from both.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from vaecf.baselines import BASELINES, DEFAULT_LAMBDA, Ease, Popularity
from vaecf.data.splits import HELDOUT_SPLITS, Split, open_split, save_parquet
from vaecf.errors import VaecfError
from vaecf.io import manifest_name, open_input, publish, write_manifest
from vaecf.io.roles import Role
from vaecf.log import info
from vaecf.metrics import Evaluation, TopK, evaluate
from vaecf.metrics.evaluation import ScoreBatch
from vaecf.metrics.model_scorer import SavedModelScorer
from vaecf.metrics.reference import paired_difference
from vaecf.stages import location, new_parser, run_stage

STAGE = "evaluate"


@dataclass(frozen=True)
class EvaluateConfig:
    """Validated flags of ``vaecf evaluate``."""

    split: str
    model: str
    output: str
    subset: str
    batch_users: int
    export_top_k: int | None
    baselines: tuple[str, ...]
    ease_lambda: float
    # How metrics.json and the manifest name the model, where ``model`` is read from a
    # staging folder that will be published elsewhere (``vaecf tune``); None: ``model``.
    model_name: str | None = None


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(STAGE, "Recall@20, Recall@50 and NDCG@100 (with standard errors) of "
                                  "a trained model or a baseline on a split's test or val users.")
    location(parser, "--split", Role.INPUT, required=True, help="split directory or s3:// prefix")
    location(parser, "--model", Role.INPUT, required=True,
             derive=lambda args: None if args.model in BASELINES else args.model,
                        help="a 'vaecf train' output (directory or s3:// prefix), or a "
                             "baseline: popularity, ease")
    location(parser, "--output", Role.OUTPUT, manifest=manifest_name(STAGE), required=True,
             help="output directory or s3:// prefix")
    parser.add_argument("--subset", default="test", help="held-out users: test or val")
    parser.add_argument("--batch-users", type=int, default=4096,
                        help="users scored and ranked at once (bounds memory: about 3 x "
                             "4 bytes x users x items)")
    parser.add_argument("--export-top-k", type=int, default=None, metavar="K",
                        help="also write top_k.parquet with the K best items per user")
    parser.add_argument("--baselines", nargs="*", default=[], metavar="NAME",
                        help="also evaluate these baselines (popularity, ease) for context")
    parser.add_argument("--ease-lambda", type=float, default=DEFAULT_LAMBDA,
                        help="L2 weight of EASE (Steck 2019 uses 500 on ML-20M)")
    return parser


def make_config(args: argparse.Namespace) -> EvaluateConfig:
    """Check the flags before any work or output (one-line errors)."""
    if args.subset not in HELDOUT_SPLITS:
        raise VaecfError(f"--subset: unknown subset '{args.subset}' (one of: "
                         f"{', '.join(HELDOUT_SPLITS)})")
    if args.batch_users < 1:
        raise VaecfError(f"--batch-users must be >= 1, got {args.batch_users}")
    if args.export_top_k is not None and args.export_top_k < 1:
        raise VaecfError(f"--export-top-k must be >= 1, got {args.export_top_k}")
    unknown = [name for name in args.baselines if name not in BASELINES]
    if unknown:
        raise VaecfError(f"--baselines: unknown baseline '{unknown[0]}' (one of: "
                         f"{', '.join(BASELINES)})")
    if not args.ease_lambda > 0:
        raise VaecfError(f"--ease-lambda must be > 0, got {args.ease_lambda}")
    return EvaluateConfig(split=args.split, model=args.model, output=args.output,
                          subset=args.subset, batch_users=args.batch_users,
                          export_top_k=args.export_top_k,
                          baselines=tuple(dict.fromkeys(args.baselines)),
                          ease_lambda=args.ease_lambda)


def run(config: EvaluateConfig, in_process: bool = False) -> dict[str, object]:
    """Evaluate and publish; returns the content of ``metrics.json``.

    ``in_process``: called by another stage (``vaecf tune``), whose process time before this
    call is not this evaluation's start-up.
    """
    started, before = time.monotonic(), 0.0 if in_process else _process_seconds()
    with ExitStack() as stack:
        model = None if config.model in BASELINES else config.model
        output = stack.enter_context(publish(config.output, manifest_name(STAGE),
                                             [config.split, model]))
        split = stack.enter_context(open_split(config.split))
        fold_in, holdout = split.heldout(config.subset)
        results: dict[str, Evaluation] = {}
        load = 0.0
        for name in (config.model, *config.baselines):
            if name not in results:
                info(f"evaluate: {name} on {fold_in.shape[0]:,} {config.subset} users")
                scorer = _scorer(name, split, config, stack)
                if name == config.model:
                    load = time.monotonic() - started
                top_k = config.export_top_k if name == config.model else None
                results[name] = evaluate(scorer, fold_in, holdout,
                                         batch_users=config.batch_users, top_k=top_k)
        main = results[config.model]
        timing = _timing(before, load, main, suggest_flags=not in_process)
        metrics = _metrics_json(config, split, main, results, timing)
        (output / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True)
                                             + "\n")
        if main.top_k is not None:
            save_parquet(output / "top_k.parquet", _top_k_table(split, config.subset, main.top_k))
        write_manifest(output, STAGE, inputs={"split": config.split,
                                              "model": config.model_name or config.model},
                       parameters=_parameters(config),
                       counts={"users_evaluated": main.users_evaluated,
                               "users_skipped": main.users_skipped, "n_items": split.n_items},
                       started=started)
    rate = main.users_per_second
    info(f"evaluate: ndcg_at_100 {main.metrics['ndcg_at_100'].mean:.4f} over "
         f"{main.users_evaluated:,} users ("
         + (f"{rate:,.0f} users/s" if rate is not None else "no steady rate")
         + f" after a start-up of {timing['startup_seconds']:.1f} s; steady rate: "
         f"{timing['steady_rate']})")
    return metrics


def _process_seconds() -> float:
    """How long this process has run (Python and TensorFlow import); 0 where unknown."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def _timing(before: float, load: float, main: Evaluation,
            suggest_flags: bool = True) -> dict[str, object]:
    """Start-up, steady chunks and a partial last chunk apart (seconds; not reproducible, like
    the rate). ``suggest_flags`` False: called by another stage, whose user cannot pass
    ``vaecf evaluate``'s flags."""
    steady = main.steady_chunks
    rate = main.users_per_second
    last = main.chunk_seconds[-1] if len(main.chunk_seconds) > 1 else 0.0
    partial_users = main.users_evaluated % main.batch_users
    partial = len(main.chunk_seconds) > 1 and partial_users > 0
    return {"process_seconds_before_stage": round(before, 3),
            "load_seconds": round(load, 3),  # split and model (TensorFlow import, if lazy)
            "first_chunk_seconds": round(main.first_chunk_seconds, 3),
            "first_chunk_users": main.first_chunk_users,
            "startup_seconds": round(before + load + main.first_chunk_seconds, 3),
            "steady_chunks": len(steady),
            "steady_users": len(steady) * main.batch_users,
            "steady_seconds": round(sum(steady), 3),
            "partial_chunk_users": partial_users if partial else 0,
            "partial_chunk_seconds": round(last, 3) if partial else 0.0,
            "users_per_second": None if rate is None else round(rate, 1),
            "steady_rate": _steady_rate(main, suggest_flags)}


def _steady_rate(main: Evaluation, suggest_flags: bool = True) -> str:
    """What ``users_per_second`` was made of, or why there is none, in words."""
    chunks = f"chunks of {main.batch_users:,} users"
    steady = len(main.steady_chunks)
    if main.users_per_second is not None:
        return (f"{steady} whole chunk{'s' if steady > 1 else ''} of {main.batch_users:,} "
                "users after the first (start-up and a partial last chunk left out)")
    return (f"none: {main.users_evaluated:,} users make no whole chunk after the first in "
            f"{chunks}" + ("; evaluate more users or pass a smaller --batch-users"
                           if suggest_flags else ""))


def _parameters(config: EvaluateConfig) -> dict[str, object]:
    """The flags that shape the result (inputs and output are recorded elsewhere)."""
    chosen = asdict(config) | {"baselines": list(config.baselines)}
    return {key: value for key, value in chosen.items()
            if key not in ("split", "model", "output", "model_name")}


def _scorer(name: str, split: Split, config: EvaluateConfig, stack: ExitStack) -> ScoreBatch:
    if name == "popularity":
        return Popularity(split.train)
    if name == "ease":
        return Ease(split.train, config.ease_lambda)
    model_dir = stack.enter_context(open_input(name))
    return SavedModelScorer(model_dir, split.n_items, split.digest, split.train)


def _metrics_json(config: EvaluateConfig, split: Split, main: Evaluation,
                  results: dict[str, Evaluation], timing: dict[str, object]
                  ) -> dict[str, object]:
    metrics: dict[str, object] = {"subset": config.subset,
                                  "model": config.model_name or config.model,
                                  **main.summary(),
                                  "users_per_second": timing["users_per_second"],
                                  "device": main.device, "n_items": split.n_items,
                                  "timing": timing}
    if config.baselines:
        metrics["baselines"] = {name: results[name].summary()
                                | {"paired": _paired(main, results[name])}
                                for name in config.baselines}
    return metrics


def _paired(model: Evaluation, baseline: Evaluation) -> dict[str, object]:
    """Model minus baseline per metric, paired on the same users (``paired_difference``)."""
    return {key: paired_difference(model.per_user[key], baseline.per_user[key])
            for key in model.per_user}


def _top_k_table(split: Split, subset: str, top: TopK) -> pa.Table:
    """One row per (evaluated user, rank): user_idx, user_id, rank, item_idx, item_id, score."""
    offset = int(split.manifest["user_offset"][subset])
    users = split.user_index().to_pandas()
    user_ids = users.set_index("user_idx")["user_id"]
    rows, ranks = np.nonzero(top.item_idx >= 0)
    user_idx = (offset + top.users[rows]).astype(np.int32)
    missing = np.setdiff1d(user_idx, user_ids.index.to_numpy())
    if missing.size:
        raise VaecfError(f"{split.directory}/user_index.parquet: no user_idx {missing[0]}")
    items = top.item_idx[rows, ranks]
    return pa.table({
        "user_idx": pa.array(user_idx, pa.int32()),
        "user_id": pa.array(user_ids.loc[user_idx].to_numpy()),
        "rank": pa.array(ranks + 1, pa.int32()),
        "item_idx": pa.array(items, pa.int32()),
        "item_id": pa.array(split.item_ids[items]),
        "score": pa.array(top.scores[rows, ranks], pa.float32()),
    })


def _body(args: argparse.Namespace) -> None:
    run(make_config(args))


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, build_parser(), argv, _body)
