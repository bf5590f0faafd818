"""``vaecf launch-sparkapp``: run preprocess or split on Spark as a SparkApplication.

The pipeline's preprocess and split steps with engine=spark run ``vaecf <stage> --engine
spark`` this way, as ``vaecf launch-mpijob`` runs training: every input is checked before the
application exists, a local input (the KFP artifact) is staged to object storage where the
driver reads it, the application is created with a name derived from the run id (or
re-attached after a KFP retry, or replaced if it failed) and followed while the driver's log
is shown, and the output the driver published in object storage is verified and published at
``--output`` (the KFP artifact the next step reads, the same as the pandas step's). A failed
application publishes nothing (the driver publishes atomically, _SUCCESS last; this step
copies only a complete output) and fails the step with the driver's last error line. SIGTERM
deletes the application; one deleted by someone else leaves the marker
``<store>/<application>/deleted/sparkapplication.json``.
"""

from __future__ import annotations

import argparse
import math
import shutil
from pathlib import Path

from vaecf import log
from vaecf.data.preprocess import PROTOCOLS
from vaecf.io import manifest_name, open_input, publish, read_manifest, storage
from vaecf.io.roles import Role
from vaecf.k8s import client, job, sparkapp
from vaecf.stages import launcher_flags, location, new_parser, run_stage, seed

STAGE = "launch-sparkapp"
# vaecf stage -> (the manifest stage of what it reads, of what it writes)
STAGES = {"preprocess": ("download", "preprocess"), "split": ("preprocess", "dataset")}


def output_manifest(args: argparse.Namespace) -> str:
    return manifest_name(STAGES.get(args.stage, STAGES["preprocess"])[1])


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(STAGE, __doc__.splitlines()[0])
    parser.add_argument("--stage", choices=tuple(STAGES), required=True,
                        help="the vaecf stage the application runs (with --engine spark)")
    location(parser, "--input", Role.INPUT, required=True,
             help="the stage's input: a directory (staged to <store>/<app>/input) or s3://")
    location(parser, "--output", Role.OUTPUT, manifest=manifest_name("preprocess"),
             manifest_of=output_manifest, required=True,
             help="where the stage's output is published (dir or s3://)")
    location(parser, "--store", Role.STORE, required=True,
             help="s3:// prefix the application reads and writes (<store>/<app>/...)")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="mission",
                        help="the stage's --protocol")
    parser.add_argument("--seed", type=seed, default=98765, help="split's --seed")
    parser.add_argument("--executors", type=int, default=2, help="executor pods")
    parser.add_argument("--executor-cores", type=int, default=2)
    parser.add_argument("--executor-memory", default="4g", help="JVM heap per executor")
    parser.add_argument("--driver-cores", type=int, default=1)
    parser.add_argument("--driver-memory", default="4g", help="JVM heap of the driver")
    launcher_flags(parser, resource="application", image="the Spark image (vaecf-spark)",
                   secret_for="the driver",
                   template="SparkApplication template (default: $VAECF_SPARKAPP_TEMPLATE or "
                            "manifests/spark/sparkapplication.yaml)", timeout=24 * 3600)
    return parser


def stage_command(args: argparse.Namespace, input_uri: str, output_uri: str) -> list[str]:
    """The vaecf stage's command line as the driver runs it, checked by the stage's own
    parser (a flag it would refuse fails here, before anything is created)."""
    from vaecf.cli import build_parser as stage_parser  # the CLI imports the stages

    command = [args.stage, "--engine", "spark", "--input", input_uri, "--output", output_uri,
               "--protocol", args.protocol]
    if args.stage == "split":
        command += ["--seed", str(args.seed)]
    stage_parser(args.stage).parse_args(command[1:])
    return command


def launch(args: argparse.Namespace) -> None:
    store = args.store.rstrip("/")  # an s3:// prefix (its role, checked before the stage runs)
    name = job.job_name(args.run_id, f"vaecf-{args.stage}", sparkapp.MAX_NAME)
    input_uri = args.input if storage.is_s3(args.input) else f"{store}/{name}/input"
    output_uri = f"{store}/{name}/output"
    params = sparkapp.SparkAppParams(
        name=name, namespace=args.namespace or client.current_namespace(), run_id=args.run_id,
        image=args.image, arguments=tuple(stage_command(args, input_uri, output_uri)),
        secret_name=args.secret_name, driver_cores=args.driver_cores,
        driver_memory=args.driver_memory, executors=args.executors,
        executor_cores=args.executor_cores, executor_memory=args.executor_memory,
        active_deadline_seconds=math.ceil(args.timeout))
    template = Path(args.template) if args.template else sparkapp.default_template()
    body = sparkapp.render_app(sparkapp.load_template(template), params)
    wanted = STAGES[args.stage][0]
    job.check_published("--input", args.input, wanted, f"vaecf {wanted}")
    storage.check_bucket(output_uri)
    run = job.JobRun(client.api_client(), sparkapp.KIND, params.namespace, name,
                     container=sparkapp.ROLES["driver"], request_timeout=args.request_timeout)
    job.refuse_deleted(store, run, args.run_id)
    written = STAGES[args.stage][1]
    with publish(args.output, manifest_name(written), [args.input]) as staging:
        job.run_to_end(run, body, args.timeout, store, args.run_id,
                       None if storage.is_s3(args.input) else (Path(args.input), input_uri))
        with open_input(output_uri) as output:
            read_manifest(output, written)
            shutil.copytree(output, staging, dirs_exist_ok=True)
        log.info(f"output of {run.ref} published at {args.output}")


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, build_parser(), argv, launch)
