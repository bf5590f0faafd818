"""Run KServe's ModelServer with one vaecf ``Predictor`` and the request limits in front.

KServe provides the endpoints (v1, v2 REST, v2 gRPC, ``/`` liveness, ``/v2/health/ready``,
``/v1/models/<name>`` readiness, ``/metrics``); ``runtime`` adds what a public endpoint needs
(``gate``: bounded headers, receive time and body, checked before a body is parsed; one-line
JSON errors for every bad request). The model is loaded and warmed up before the server
listens, so readiness means "can answer now". SIGTERM (Kubernetes' stop) drains: REST and gRPC
stop taking new work at once, in-flight requests finish within ``grace_period`` seconds and
the process exits 0.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any

from vaecf import log


@dataclass(frozen=True)
class ServeConfig:
    """``vaecf serve`` flags (KServe's own names where KServe has the flag; the defaults are
    the parser's, ``vaecf.stages.serve``)."""

    model: str
    model_name: str
    http_port: int
    grpc_port: int
    workers: int
    enable_grpc: bool
    max_threads: int
    grace_period: int
    max_batch_users: int
    max_header_bytes: int
    request_timeout: float


def import_kserve() -> Any:
    """``import kserve``, which parses ``sys.argv`` at import (``kserve.model_server``).

    ``vaecf serve`` has parsed its flags already and passes every value explicitly; KServe
    must not read ``--model`` as an abbreviation of its ``--model_name``, nor exit on a flag
    it does not know.
    """
    saved = sys.argv
    sys.argv = saved[:1]
    try:
        import kserve
    finally:
        sys.argv = saved
    return kserve


def serve(config: ServeConfig) -> None:
    """Load the model, then serve it until SIGTERM/SIGINT (returns once drained)."""
    import_kserve()
    from kserve import model_server

    from vaecf.serve import heap
    from vaecf.serve.predictor import Predictor
    from vaecf.serve.protocol import MAX_BODY_BYTES
    from vaecf.serve.runtime import ModelServer, install

    heap.map_large_blocks_apart()
    predictor = Predictor(config.model_name, config.model, config.max_batch_users)
    predictor.load()
    install(model_server.app, MAX_BODY_BYTES)
    log.info(f"serving {config.model_name} on http :{config.http_port}"
             + (f", grpc :{config.grpc_port}" if config.enable_grpc else ""))
    server = ModelServer(http_port=config.http_port, grpc_port=config.grpc_port,
                         workers=config.workers, enable_grpc=config.enable_grpc,
                         max_threads=config.max_threads, grace_period=config.grace_period,
                         enable_latency_logging=False, max_header_bytes=config.max_header_bytes,
                         request_timeout=config.request_timeout,
                         grpc_max_receive_bytes=MAX_BODY_BYTES,
                         grpc_max_send_bytes=predictor.max_answer_bytes)
    # KServe's per-request timing lines (two per request) repeat what /metrics exports; the
    # access log (one line per request) stays.
    logging.getLogger("kserve.trace").setLevel(logging.WARNING)
    server.start([predictor])
    log.info("server stopped")
