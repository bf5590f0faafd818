"""``vaecf deploy``: the pipeline's optional serve step, which points KServe at the new model.

It serves the model that the train step's MPIJob left in object storage
(``<store>/<job>/model``, the job named from the run id as ``launch-mpijob`` names it), after
checking that this is the model the step was given (same ``train_manifest.json``), and
creates the InferenceService or patches the existing one, so KServe rolls the predictor over
to the new model. Every check runs before the cluster is asked anything.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vaecf import log
from vaecf.errors import VaecfError
from vaecf.io import open_input, read_manifest
from vaecf.io.roles import Role
from vaecf.k8s import client, render
from vaecf.k8s import inferenceservice as isvc
from vaecf.stages import location, new_parser, run_stage

STAGE = "deploy"


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(STAGE, __doc__.splitlines()[0])
    location(parser, "--model", Role.INPUT, required=True,
                        help="the trained model (the train step's output, dir or s3://)")
    location(parser, "--store", Role.STORE, required=True,
                        help="s3:// prefix the train step's MPIJob wrote (<store>/<job>/model)")
    parser.add_argument("--run-id", required=True, help="pipeline run id (names the job)")
    parser.add_argument("--image", required=True, help="serve image (runs 'vaecf serve')")
    parser.add_argument("--name", default="vaecf",
                        help="InferenceService name, also the model name in its endpoints")
    parser.add_argument("--namespace", help="default: this pod's namespace, else 'default'")
    parser.add_argument("--service-account", default="vaecf-serve",
                        help="the predictor's ServiceAccount (S3 credentials for KServe)")
    # A str, not a Path: Path("s3://b/k") is the local "s3:/b/k", which the check would miss.
    location(parser, "--template", Role.LOCAL_FILE, default=None,
                        help="InferenceService template (default: "
                             "$VAECF_INFERENCESERVICE_TEMPLATE or "
                             "manifests/serving/inferenceservice.yaml)")
    return parser


def model_uri(args: argparse.Namespace) -> str:
    """Where the train step's MPIJob wrote the model (``<store>/<job>/model``)."""
    store = args.store.rstrip("/")  # an s3:// prefix (its role, checked before the stage runs)
    return f"{store}/{render.job_name(args.run_id)}/model"


def check_model(given: str, uri: str) -> None:
    """``uri`` must hold the model the step was given: the same files, by checksum."""
    with open_input(given) as local:
        expected = read_manifest(local, "train")
    with open_input(uri) as stored:
        found = read_manifest(stored, "train")
    if json.dumps(found.get("files"), sort_keys=True) != json.dumps(expected.get("files"),
                                                                    sort_keys=True):
        raise VaecfError(f"{uri}: holds another model than --model {given} (their "
                         "train_manifest.json files differ)")


def deploy(args: argparse.Namespace) -> None:
    params = isvc.ServiceParams(
        name=args.name, namespace=args.namespace or client.current_namespace(),
        run_id=args.run_id, image=args.image, storage_uri=model_uri(args),
        service_account=args.service_account)
    isvc.validate(params)  # flags first: nothing is read for a bad name or image
    service = isvc.render_service(
        isvc.load_template(Path(args.template) if args.template else isvc.default_template()),
        params)
    check_model(args.model, params.storage_uri)
    outcome = isvc.apply(client.api_client(), service)
    log.info(f"{outcome} inferenceservice {params.namespace}/{params.name} (model "
             f"{params.storage_uri}): v1 at /v1/models/{params.name}:predict, v2 at "
             f"/v2/models/{params.name}/infer")


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, build_parser(), argv, deploy)
