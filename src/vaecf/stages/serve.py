"""``vaecf serve``: answer top-k requests for any user, given by raw item ids (KServe).

Starts KServe's ModelServer with one model, a ``vaecf train`` output (local or s3://): v1
``POST /v1/models/<name>:predict``, v2 (Open Inference Protocol) over REST and gRPC, health,
readiness and ``/metrics`` as KServe provides them. Flags that KServe's own model servers have
keep KServe's names (``--model_name``, ``--http_port``, ``--grpc_port``, ``--workers``,
``--enable_grpc``, ``--max_threads``), so an InferenceService's args read the same. The server
binds every interface (KServe's choice: REST 0.0.0.0, gRPC [::]).
"""

from __future__ import annotations

import argparse
import re

from vaecf.errors import VaecfError
from vaecf.io.roles import Role
from vaecf.stages import location, new_parser, run_stage

DEFAULT_BATCH_USERS = 256  # users per model call: 32 clients x 8 users in one go
MAX_HEADER_BYTES = 32 * 2**10  # request line + headers; standard clients send < 1 KiB
REQUEST_TIMEOUT = 30.0  # seconds to receive a whole request (8 MiB at 2 Mbit/s: 34 s)

STAGE = "serve"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")


def port(text: str) -> int:
    """argparse type of a TCP port: 1..65535."""
    value = int(text) if text.isdigit() else -1
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, got {text}")
    return value


def positive(text: str) -> int:
    value = int(text) if text.isdigit() else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def seconds(text: str) -> float:
    """argparse type of a duration: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text}")
    return value


def boolean(text: str) -> bool:
    """KServe's ``strtobool`` spellings (``--enable_grpc false``)."""
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "y", "on", "t"):
        return True
    if lowered in ("0", "false", "no", "n", "off", "f"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text}")


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(STAGE, "Serve a trained model with KServe (v1, v2 REST and gRPC).")
    location(parser, "--model", Role.INPUT, required=True, help="'vaecf train' output (dir or s3://)")
    parser.add_argument("--model_name", default="vaecf",
                        help="name in the endpoints' paths (/v1/models/<name>:predict)")
    parser.add_argument("--http_port", type=port, default=8080, help="REST port (v1 and v2)")
    parser.add_argument("--grpc_port", type=port, default=8081, help="gRPC port (v2)")
    parser.add_argument("--enable_grpc", type=boolean, default=True,
                        help="serve v2 over gRPC too (true/false)")
    parser.add_argument("--workers", type=positive, default=1,
                        help="REST worker processes; only 1: KServe spawns further workers "
                             "from a pickled model, which a loaded TensorFlow model is not "
                             "(scale with replicas instead)")
    parser.add_argument("--max_threads", type=positive, default=4, help="gRPC threads")
    parser.add_argument("--grace-period", type=positive, default=30,
                        help="seconds in-flight requests get to finish after SIGTERM")
    parser.add_argument("--max-batch-users", type=positive, default=DEFAULT_BATCH_USERS,
                        help="most users in one model call (requests waiting together; a "
                             "larger request is served by several calls); the warm-up runs "
                             "calls of this size")
    parser.add_argument("--max-header-bytes", type=positive, default=MAX_HEADER_BYTES,
                        help="most bytes of a request's line and headers (431 past it)")
    parser.add_argument("--request-timeout", type=seconds, default=REQUEST_TIMEOUT,
                        help="seconds a request (headers and body) may take to arrive in "
                             "full, and an idle new connection may stay open (408 past it); "
                             "an answer its client stops reading for this long closes its "
                             "connection")
    return parser


def _body(args: argparse.Namespace) -> None:
    from vaecf.serve.server import ServeConfig, serve

    if not _NAME.match(args.model_name):
        raise VaecfError(f"--model_name {args.model_name!r}: expected lower-case letters, "
                         "digits, '-', '_' or '.'")
    if args.workers != 1:
        raise VaecfError(f"--workers {args.workers}: vaecf serves from one process (KServe's "
                         "extra workers are spawned from a pickled model, and a loaded "
                         "TensorFlow model cannot be pickled); scale with replicas")
    if args.enable_grpc and args.grpc_port == args.http_port:
        raise VaecfError(f"--grpc_port {args.grpc_port}: the same as --http_port")
    serve(ServeConfig(model=args.model, model_name=args.model_name, http_port=args.http_port,
                      grpc_port=args.grpc_port, workers=args.workers,
                      enable_grpc=args.enable_grpc, max_threads=args.max_threads,
                      grace_period=args.grace_period, max_batch_users=args.max_batch_users,
                      max_header_bytes=args.max_header_bytes,
                      request_timeout=args.request_timeout))


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, build_parser(), argv, _body)
