"""``vaecf launch-mpijob``: the pipeline's train step, which runs ``vaecf train`` as an MPIJob.

Order matters: every input is checked before the job exists (a bad input must not be retried
on GPUs), the split is staged to object storage where the MPIJob's pods can read it, the job is
created (or re-attached after a KFP retry, or replaced if it failed) and watched, and the model
the job wrote to object storage is verified and published at ``--output`` (the KFP Model
artifact). A job deleted by someone else while the step follows it leaves a marker,
``<store>/<job>/deleted/mpijob.json``, that keeps every later attempt under the same run id from
creating it again.
"""

from __future__ import annotations

import argparse
import math
import shutil
from pathlib import Path

from vaecf import log
from vaecf.io import manifest_name, open_input, publish, read_manifest, storage
from vaecf.io.roles import Role
from vaecf.k8s import client, job, mpijob, render
from vaecf.stages import launcher_flags, location, new_parser, run_stage, seed
from vaecf.train.scaling import BASE_LEARNING_RATE, LR_RULES
from vaecf.tuning.space import SEARCHABLE, parse_trial, train_flags

STAGE = "launch-mpijob"
SPLIT_STAGE = "dataset"  # the split directory's manifest (vaecf.data.splits.MANIFEST_STAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(STAGE, __doc__.splitlines()[0])
    location(parser, "--split", Role.INPUT, required=True, help="split directory or s3:// prefix")
    location(parser, "--output", Role.OUTPUT, manifest=manifest_name("train"), required=True,
                        help="where the trained model directory is published (dir or s3://)")
    location(parser, "--store", Role.STORE, required=True,
                        help="s3:// prefix the MPIJob reads and writes (<store>/<job>/...)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--gpus-per-worker", type=int, default=1)
    parser.add_argument("--slots-per-worker", type=int,
                        help="Horovod ranks per worker (default: GPUs per worker, at least 1)")
    parser.add_argument("--epochs", type=int, default=0,
                        help="train exactly this many epochs (0: stop early, as vaecf train "
                             "without --epochs) [default: %(default)s]")
    parser.add_argument("--patience", type=int, default=render.MPIJobParams.patience,
                        help="with --epochs 0: stop once the validation NDCG@100 has not "
                             "improved for this many epochs [default: %(default)s]")
    parser.add_argument("--max-epochs", type=int, default=render.MPIJobParams.max_epochs,
                        help="with --epochs 0: stop here at the latest [default: %(default)s]")
    parser.add_argument("--batch-per-rank", type=int, default=render.BATCH_PER_RANK,
                        help="users per step on each rank (one rank per GPU); the global "
                             "batch is this x workers x slots per worker")
    parser.add_argument("--lr-scaling", default=render.LR_SCALING,
                        help=f"learning rate {BASE_LEARNING_RATE:g} (vaecf train's) at 500 "
                             f"users per step, scaled to the global batch: {', '.join(LR_RULES)}")
    parser.add_argument("--precision", choices=render.PRECISIONS,
                        default=render.MPIJobParams.precision,
                        help="[default: %(default)s, the fastest measured on a GPU]")
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument("--xla", nargs="?", const="true", default="true",
                        choices=("true", "false"),
                        help="compile the training step with XLA (--xla false: off) "
                             "[default: %(default)s]")
    parser.add_argument("--compression", default="none",
                        help="gradient allreduce format: none or fp16 (halves the bytes "
                             "between hosts)")
    parser.add_argument("--nccl-debug", default="WARN",
                        help="NCCL_DEBUG of every rank (INFO shows the transport, e.g. "
                             "NET/IB or NET/Socket)")
    launcher_flags(parser, resource="job", image="train image of launcher and workers",
                   secret_for="the MPIJob's pods",
                   template="MPIJob template (default: $VAECF_MPIJOB_TEMPLATE or "
                            "manifests/mpijob.yaml)", timeout=48 * 3600)
    parser.add_argument("--tensorboard", action=argparse.BooleanOptionalAction, default=True,
                        help="rank 0 writes TensorBoard event files to "
                             "<store>/<job>/tensorboard (point TensorBoard at <store>/)")
    parser.add_argument("--hyperparameters", default="{}", metavar="JSON",
                        help="training hyperparameters of a tuning trial, e.g. "
                             '\'{"beta_cap": 0.3, "learning_rate": 0.001}\' (keys: '
                             f"{', '.join(SEARCHABLE)})")
    return parser


def params_from_args(args: argparse.Namespace) -> render.MPIJobParams:
    name = render.job_name(args.run_id)
    store = args.store.rstrip("/")  # an s3:// prefix (its role, checked before the stage runs)
    trial = parse_trial(args.hyperparameters, "--hyperparameters")
    epochs = trial.pop("epochs", args.epochs) or None  # 0: stop early
    return render.MPIJobParams(
        name=name, namespace=args.namespace or client.current_namespace(), run_id=args.run_id,
        image=args.image,
        split_uri=args.split if storage.is_s3(args.split) else f"{store}/{name}/split",
        model_uri=f"{store}/{name}/model", checkpoint_uri=f"{store}/{name}/checkpoints",
        workers=args.workers, gpus_per_worker=args.gpus_per_worker,
        slots_per_worker=args.slots_per_worker or max(1, args.gpus_per_worker),
        epochs=epochs, patience=args.patience, max_epochs=args.max_epochs,
        batch_per_rank=args.batch_per_rank, lr_scaling=args.lr_scaling,
        precision=args.precision, seed=args.seed, xla=args.xla == "true",
        compression=args.compression,
        nccl_debug=args.nccl_debug, secret_name=args.secret_name,
        tensorboard_uri=f"{store}/{name}/tensorboard" if args.tensorboard else None,
        train_flags=tuple(train_flags(trial)), active_deadline_seconds=math.ceil(args.timeout))


def launch(args: argparse.Namespace) -> None:
    params = params_from_args(args)
    template = Path(args.template) if args.template else render.default_template()
    body = render.render(render.load_template(template), params)
    job.check_published("--split", args.split, SPLIT_STAGE, "vaecf split")
    storage.check_bucket(params.model_uri)
    run = job.JobRun(client.api_client(), mpijob.KIND, params.namespace, params.name,
                     container=render.container(body["spec"], "Launcher")["name"],
                     request_timeout=args.request_timeout)
    job.refuse_deleted(args.store, run, args.run_id)
    with publish(args.output, manifest_name("train"), [args.split]) as staging:
        job.run_to_end(run, body, args.timeout, args.store, args.run_id,
                       None if storage.is_s3(args.split) else (Path(args.split),
                                                               params.split_uri))
        with open_input(params.model_uri) as model:
            manifest = read_manifest(model, "train")
            shutil.copytree(model, staging, dirs_exist_ok=True)
        log.info(f"model of {run.ref} (best epoch {manifest.get('best_epoch')}) "
                 f"published at {args.output}")


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, build_parser(), argv, launch)
