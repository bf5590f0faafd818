"""``vaecf tune``: search training hyperparameters on a split, pick the best by validation.

Two ways in, one way out. On a laptop, ``vaecf tune --split S --output O`` trains every trial
of the search (``--space``, ``--trials``, ``--seed``) itself. In the KFP sweep, the trials
ran as MPIJobs in a ``dsl.ParallelFor``, each followed by ``vaecf evaluate --subset val``,
and the fan-in step passes their models and validation metrics with ``--collect-models`` and
``--collect-evaluations`` (the same order). Either way the best trial by validation NDCG@100 is
evaluated once on the test users (beside the baselines), and ``trials.jsonl``, ``test/``
(that evaluation's output) and ``tune_manifest.json`` are published. ``vaecf report
--trials O/trials.jsonl`` shows every trial.
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from vaecf import log
from vaecf.baselines import BASELINES, DEFAULT_LAMBDA
from vaecf.data.splits import open_split
from vaecf.errors import VaecfError
from vaecf.io import manifest_name, open_input, publish, scratch, write_manifest
from vaecf.io.readers import read_text
from vaecf.io.roles import Role
from vaecf.stages import location, new_parser, run_stage, seed
from vaecf.train.config import PRECISIONS
from vaecf.tuning.space import DEFAULT_SPACE, SPACE_LIMIT, load_space, search
from vaecf.tuning.trials import (
    CHOICE_RULE,
    OBJECTIVE,
    VAL_KEYS,
    choose,
    collect,
    describe_choice,
    val_per_user,
    write_trials,
)

STAGE = "tune"


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(STAGE, "Search Mult-VAE's training hyperparameters on a split: pick "
                               "the best trial by validation NDCG@100, evaluate it once on "
                               "the test users.")
    add = parser.add_argument
    location(parser, "--split", Role.INPUT, required=True,
             help="split directory or s3:// prefix (vaecf split)")
    location(parser, "--output", Role.OUTPUT, manifest=manifest_name(STAGE), required=True,
             help="output directory or s3:// prefix")
    location(parser, "--space", Role.INPUT_FILE, prefix="@", default=json.dumps(DEFAULT_SPACE),
             metavar="JSON", help="hyperparameter -> list of values, JSON or @file.json (keys: "
             "beta_cap, anneal_steps (null: train's default schedule), learning_rate, dropout, "
             "epochs, hidden, latent, and RecVAE's options: kl_per_item (null: off), "
             "composite_prior (true/false), alternate, encoder_layers, implicit_slim_every)")
    add("--trials", type=int, default=8, help="trials: trial 0 is vaecf train's defaults "
        "(the reference), then the rest of the grid if it has at most this many points, else "
        "a random sample of it drawn with --seed; the best replaces trial 0 only when it "
        "leads it on the validation users by more than the paired standard error")
    add("--seed", type=seed, default=0, help="seed of the sample and of every trial's training")
    add("--epochs", type=int, default=None, help="epochs of every trial unless searched "
        "[default: each trial stops early, as vaecf train without --epochs]")
    add("--patience", type=int, default=None, help="early stopping's patience of every trial "
        "(see vaecf train)")
    add("--max-epochs", type=int, default=None, help="early stopping's cap of every trial "
        "(see vaecf train)")
    add("--batch-size", type=int, default=None, help="global batch of every trial [default: "
        "train's]")
    add("--precision", choices=PRECISIONS, default="fp32",
        help="precision of every trial (see vaecf train)")
    add("--baselines", nargs="*", default=["popularity", "ease"], metavar="NAME",
        help="evaluated beside the best trial on the test users")
    location(parser, "--collect-models", Role.INPUT, nargs="+",
             derive=lambda args: _collected(args, "models"), metavar="DIR",
             help="KFP fan-in: the trials' models")
    location(parser, "--collect-evaluations", Role.INPUT, nargs="+",
             derive=lambda args: _collected(args, "evaluations"), metavar="DIR",
             help="KFP fan-in: their 'vaecf evaluate --subset val' outputs, in the same order")
    add("--executor-input", metavar="JSON", help="KFP fan-in: the executor input, whose "
        "input artifact lists 'models' and 'evaluations' replace the two flags above")
    return parser


def _collected(args: argparse.Namespace, name: str) -> list[str] | None:
    """``--collect-models``/``--collect-evaluations``, or ``--executor-input``'s list."""
    if args.executor_input:
        return collected_paths(args.executor_input, name)
    given: list[str] | None = getattr(args, f"collect_{name}")
    return given


# KFP mounts an input artifact at a local path derived from its URI (kfp.dsl.Artifact.path).
KFP_MOUNTS = (("gs://", "/gcs/"), ("minio://", "/minio/"), ("s3://", "/s3/"))


def collected_paths(executor_input: str, name: str) -> list[str]:
    """Local paths of the input artifact list ``name`` (a ``dsl.Collected``), in order."""
    try:
        artifacts = json.loads(executor_input)["inputs"]["artifacts"][name]["artifacts"]
        uris = [str(artifact["uri"]) for artifact in artifacts]
    except (ValueError, KeyError, TypeError) as err:
        raise VaecfError(f"--executor-input: no input artifact list '{name}' ({err})") from None
    paths = []
    for uri in uris:
        prefix = next(((r, m) for r, m in KFP_MOUNTS if uri.startswith(r)), ("", ""))
        paths.append(prefix[1] + uri[len(prefix[0]):])
    return paths


def _space(text: str) -> dict[str, list[Any]]:
    if text.startswith("@"):
        where = f"--space {text}"
        return load_space(read_text(Path(text[1:]), where, limit=SPACE_LIMIT), where)
    return load_space(text, "--space")


def run(args: argparse.Namespace) -> None:
    started = time.monotonic()
    args.collect_models = _collected(args, "models")
    args.collect_evaluations = _collected(args, "evaluations")
    collecting = bool(args.collect_models or args.collect_evaluations)
    space = None if collecting else _space(args.space)
    chosen = [] if space is None else search(space, args.trials, args.seed)
    unknown = [name for name in args.baselines if name not in BASELINES]
    if unknown:
        raise VaecfError(f"--baselines: unknown baseline '{unknown[0]}' (one of: "
                         f"{', '.join(BASELINES)})")
    common = {"epochs": args.epochs, "patience": args.patience, "max_epochs": args.max_epochs,
              "batch_size": args.batch_size}
    if args.epochs is not None and (args.patience or args.max_epochs):
        raise VaecfError("--patience and --max-epochs apply only without --epochs")
    inputs = [args.split, *(args.collect_models or []), *(args.collect_evaluations or [])]
    with ExitStack() as stack:
        staging = stack.enter_context(publish(args.output, manifest_name(STAGE), inputs))
        if collecting:
            records = collect(args.collect_models or [], args.collect_evaluations or [], stack)
        else:
            from vaecf.tuning.local import run_trials

            base = {"precision": args.precision, "seed": args.seed,
                    **{k: v for k, v in common.items() if v is not None},
                    **({} if args.batch_size else {"batch_size_default": True})}
            records = run_trials(args.split, staging / "trials",
                                 stack.enter_context(scratch(staging)), chosen, base)

        def where(entry: dict[str, Any]) -> str:
            """A trial's model as this process reads it (local trials: in the staging)."""
            return entry["model"] if collecting else str(staging / entry["model"])

        split = stack.enter_context(open_split(args.split))
        best, decision = choose(records, lambda entry: val_per_user(
            split, stack.enter_context(open_input(where(entry)))))
        log.info(f"tune: {describe_choice(decision)}")
        log.info(f"tune: chose trial {best['trial']} of {len(records)} (val "
                 f"{OBJECTIVE} {_with_error(best['val'], best.get('val_stderr'))}; "
                 f"{CHOICE_RULE}); evaluating it on the test users")
        # Local trials are read from the staging folder and named where they are published.
        model, name = ((where(best), f"{args.output.rstrip('/')}/{best['model']}")
                       if not collecting else (best["model"], best["model"]))
        test = _evaluate_test(args, model, name, staging / "test")
        for line in result_lines(best, test):
            log.info(line)
        write_trials(staging / "trials.jsonl", records)
        write_manifest(staging, STAGE, inputs={"split": args.split,
                                               "models": args.collect_models or [],
                                               "evaluations": args.collect_evaluations or []},
                       parameters={"space": space,
                                   "trials": len(records), "seed": args.seed,
                                   "baselines": list(args.baselines), "rule": CHOICE_RULE},
                       counts={"trials": len(records)}, started=started,
                       extra={"best": best, "choice": decision,
                              "test": {k: test[k] for k in VAL_KEYS}})


def _with_error(values: dict[str, float], errors: dict[str, Any] | None,
                key: str = OBJECTIVE) -> str:
    error = (errors or {}).get(key)
    return f"{values[key]:.4f}" + (f" +- {error:.4f}" if isinstance(error, float) else "")


def result_lines(best: dict[str, Any], test: dict[str, Any]) -> list[str]:
    """The best trial's test metrics, each baseline's and the paired z against them."""
    def metrics(values: dict[str, Any]) -> str:
        return ", ".join(f"{key} {values[key]['mean']:.4f} +- {values[key]['stderr']:.4f}"
                         for key in VAL_KEYS)

    lines = [f"tune: trial {best['trial']} on the test users: {metrics(test)}"]
    for name, values in (test.get("baselines") or {}).items():
        paired = values["paired"][OBJECTIVE]
        z = "undefined" if paired["z"] is None else f"{paired['z']:+.1f}"
        lines.append(f"tune: {name} on the same users: {metrics(values)}; trial "
                     f"{best['trial']} minus {name}: {OBJECTIVE} {paired['delta']:+.4f} "
                     f"(paired z {z})")
    return lines


def _evaluate_test(args: argparse.Namespace, model: str, name: str,
                   output: Path) -> dict[str, Any]:
    """The best trial on the test users, once, through ``vaecf evaluate``'s own code;
    ``name`` is where the model will be once published."""
    from vaecf.stages.evaluate import EvaluateConfig
    from vaecf.stages.evaluate import run as evaluate

    return evaluate(EvaluateConfig(split=args.split, model=model, output=str(output),
                                   subset="test", batch_users=4096, export_top_k=None,
                                   baselines=tuple(args.baselines), ease_lambda=DEFAULT_LAMBDA,
                                   model_name=name),
                    in_process=True)


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, build_parser(), argv, run)
