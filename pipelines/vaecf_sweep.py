"""The vaecf tuning sweep: data -> N trials (train MPIJob + validation) in parallel -> best.

download -> preprocess -> split -> ParallelFor(trials, parallelism) { train, validate_trial }
-> select_best (dsl.Collected: best by validation NDCG@100, evaluated once on test) ->
tuning_report (every trial as a table and a plot). Compile it with ``make pipeline`` (beside
the main pipeline) or ``python -m pipelines.vaecf_sweep --output FILE [--trials FILE.json]``;
each trial is a JSON object of ``vaecf train`` hyperparameters. The trials are compiled into
the sweep (a parameter would reach the backend as a string, which it refuses for a list), so
every run parameter stays a string, as in the main pipeline. Each MPIJob's name derives from
its trial's task id, inside the step.
"""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from kfp import compiler, dsl

from components.images import DEFAULT, Images
from components.train import train
from components.tune import select_best, tuning_report, validate_trial
from pipelines.vaecf_pipeline import (
    compile_parser,
    data_steps,
    images_of,
    retry_io,
    use_gpus,
    use_s3_credentials,
)

# `vaecf tune`'s default trials (vaecf.tuning.space.search of DEFAULT_SPACE with --trials 8,
# in its order; a test keeps the two equal), written out so that compiling needs only kfp.
# Trial 0 is `vaecf train`'s defaults, the reference the fan-in keeps unless the best trial
# leads it by more than the paired standard error on the validation users. No trial gives
# epochs: each stops early, as the train step does with its default epochs "0".
DEFAULT_TRIALS = [json.dumps(trial, sort_keys=True) for trial in (
    {"hidden": hidden, "kl_per_item": kl_per_item, "learning_rate": learning_rate}
    for hidden, kl_per_item, learning_rate in (
        (1200, None, 5e-4), (600, None, 5e-4), (600, 0.005, 5e-4), (600, None, 1e-3),
        (600, 0.005, 1e-3), (1200, 0.005, 5e-4), (1200, None, 1e-3), (1200, 0.005, 1e-3)))]
PARALLELISM = 3  # trials at once: each holds workers x GPUs for its whole run


def build_sweep(images: Images = DEFAULT, parallelism: int = PARALLELISM,
                trials: list[str] | None = None) -> Callable[..., Any]:
    """The sweep with its images, trials (JSON objects) and parallelism limit fixed."""
    items = list(trials or DEFAULT_TRIALS)

    @dsl.pipeline(name="vaecf-sweep", description="Mult-VAE hyperparameter sweep: trials as "
                  "MPIJobs in parallel, the best by validation NDCG@100 tested once.")
    # Strings throughout, as in the main pipeline (`kfp run submit key=value` sends strings).
    def vaecf_sweep(dataset: str = "synthetic",
                    source: Optional[str] = None,  # noqa: UP045 (kfp needs typing.Optional)
                    user_column: Optional[str] = None,  # noqa: UP045
                    item_column: Optional[str] = None,  # noqa: UP045
                    value_column: Optional[str] = None,  # noqa: UP045
                    value_kind: Optional[str] = None,  # noqa: UP045
                    protocol: str = "mission", seed: str = "98765",
                    batch_per_rank: str = "1024", precision: str = "mixed_bfloat16",
                    xla: str = "true", workers: str = "2", gpus_per_worker: str = "1",
                    s3_bucket: str = "vaecf",
                    s3_prefix: str = "sweeps", s3_secret: str = "vaecf-s3",
                    train_image: str = images.train) -> None:
        columns = {"user_column": user_column, "item_column": item_column,
                   "value_column": value_column, "value_kind": value_kind}
        splitted = data_steps(images, dataset, source, protocol, seed, s3_secret, columns)

        with dsl.ParallelFor(items=items, parallelism=parallelism) as trial:
            # Each iteration has its own task id: the MPIJob's name derives from it.
            trained = train(split=splitted.outputs["split"],
                            run_id=dsl.PIPELINE_TASK_ID_PLACEHOLDER, train_image=train_image,
                            s3_bucket=s3_bucket, s3_prefix=s3_prefix, workers=workers,
                            gpus_per_worker=gpus_per_worker, batch_per_rank=batch_per_rank,
                            precision=precision, xla=xla, seed=seed, s3_secret=s3_secret,
                            hyperparameters=trial)
            trained.set_container_image(images.launcher).set_caching_options(False)
            retry_io(use_s3_credentials(trained, s3_secret))

            validated = validate_trial(split=splitted.outputs["split"],
                                       model=trained.outputs["model"])
            use_gpus(validated.set_container_image(images.train), 1)

        best = select_best(split=splitted.outputs["split"],
                           models=dsl.Collected(trained.outputs["model"]),
                           evaluations=dsl.Collected(validated.outputs["evaluation"]))
        use_gpus(best.set_container_image(images.train), 1)

        reported = tuning_report(split=splitted.outputs["split"],
                                 tuning=best.outputs["tuning"])
        reported.set_container_image(images.launcher)

    return vaecf_sweep


def compile_sweep(output: Path, images: Images = DEFAULT, parallelism: int = PARALLELISM,
                  trials: list[str] | None = None) -> Path:
    output.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_sweep(images, parallelism, trials), str(output))
    return output


def load_trials(path: Path) -> list[str]:
    """A JSON list of trial objects (``[{"beta_cap": 0.3}, ...]``), each as JSON text."""
    trials = json.loads(path.read_text())
    if not (isinstance(trials, list) and trials and all(isinstance(t, dict) for t in trials)):
        raise ValueError(f"{path}: expected a non-empty JSON list of objects")
    return [json.dumps(trial, sort_keys=True) for trial in trials]


def main(argv: list[str] | None = None) -> int:
    parser = compile_parser("python -m pipelines.vaecf_sweep",
                            "Compile the vaecf tuning sweep to YAML.", "build/vaecf_sweep.yaml")
    parser.add_argument("--parallelism", type=int, default=PARALLELISM,
                        help="trials running at once")
    parser.add_argument("--trials", type=Path, help="JSON list of trials (hyperparameter "
                                                    "objects) instead of vaecf tune's default "
                                                    "grid")
    args = parser.parse_args(argv)
    if args.parallelism < 1:
        parser.error(f"--parallelism: expected >= 1, got {args.parallelism}")
    trials = load_trials(args.trials) if args.trials else None
    path = compile_sweep(args.output, images_of(args), args.parallelism, trials)
    print(f"compiled {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
