"""Run KServe's ModelServer with one vaecf ``Predictor`` and the request limits in front.

KServe provides the endpoints (v1, v2 REST, v2 gRPC, ``/`` liveness, ``/v2/health/ready``,
``/v1/models/<name>`` readiness, ``/metrics``); this module adds what a public endpoint needs
before a body is parsed: a JSON content type and a Content-Length within ``MAX_BODY_BYTES``
(``RequestLimits``), and one-line 400s for v2 bodies that fail KServe's schema. The model is
loaded and warmed up before the server listens, so readiness means "can answer now".
SIGTERM (Kubernetes' stop) drains: uvicorn closes the listening socket, lets in-flight requests
finish within ``grace_period`` seconds and the process exits 0.
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


class RequestLimits:
    """ASGI middleware: a POST must say JSON and its length, within ``max_body_bytes``.

    Checked from the headers, before the body is read: an oversized body is refused without
    being received (413), a missing or non-JSON content type gets 415, no Content-Length 411.
    """

    def __init__(self, app: Any, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            refusal = self.refusal(dict(scope["headers"]))
            if refusal is not None:
                return await _send_error(send, *refusal)
        await self.app(scope, receive, send)

    def refusal(self, headers: dict[bytes, bytes]) -> tuple[int, str] | None:
        kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if kind != b"application/json":
            given = f"got {kind.decode('latin-1')!r}" if kind else "none given"
            return 415, f"Content-Type: expected application/json, {given}"
        length = headers.get(b"content-length")
        if length is None:
            return 411, "Content-Length: required (chunked request bodies are not accepted)"
        if not length.isdigit():
            return 400, "Content-Length: expected a number of bytes"
        if int(length) > self.max_body_bytes:
            return 413, (f"request body of {int(length):,} bytes, over the limit of "
                         f"{self.max_body_bytes:,}")
        return None


async def _send_error(send: Any, status: int, message: str) -> None:
    import orjson

    body = orjson.dumps({"error": message})
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _install(app: Any, max_body_bytes: int) -> None:
    """Limits in front of KServe's app; KServe's schema errors as one-line 400s."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import ORJSONResponse
    from kserve.errors import invalid_input_handler

    from vaecf.serve.protocol import RequestTooLarge

    async def schema_error(_: Any, exc: RequestValidationError) -> ORJSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            return ORJSONResponse(status_code=400, content={
                "error": f"request body: malformed JSON ({first.get('ctx', {}).get('error')})"})
        where = ".".join(str(part) for part in first.get("loc", ())
                         if part not in ("body", "InferenceRequest"))
        message = first.get("msg", "invalid request")
        return ORJSONResponse(status_code=400,
                              content={"error": f"{where or 'request body'}: {message}"})

    async def too_large(request: Any, exc: RequestTooLarge) -> Any:
        response = await invalid_input_handler(request, exc)
        response.status_code = 413
        return response

    app.add_middleware(RequestLimits, max_body_bytes=max_body_bytes)
    app.add_exception_handler(RequestValidationError, schema_error)
    app.add_exception_handler(RequestTooLarge, too_large)


def serve(config: ServeConfig) -> None:
    """Load the model, then serve it until SIGTERM/SIGINT (returns once drained)."""
    kserve = import_kserve()
    from kserve import model_server

    from vaecf.serve.predictor import Predictor
    from vaecf.serve.protocol import MAX_BODY_BYTES

    predictor = Predictor(config.model_name, config.model, config.max_batch_users)
    predictor.load()
    _install(model_server.app, MAX_BODY_BYTES)
    log.info(f"serving {config.model_name} on http :{config.http_port}"
             + (f", grpc :{config.grpc_port}" if config.enable_grpc else ""))
    server = kserve.ModelServer(http_port=config.http_port, grpc_port=config.grpc_port,
                                workers=config.workers, enable_grpc=config.enable_grpc,
                                max_threads=config.max_threads,
                                grace_period=config.grace_period,
                                enable_latency_logging=False)
    # KServe's per-request timing lines (two per request) repeat what /metrics exports; the
    # access log (one line per request) stays.
    logging.getLogger("kserve.trace").setLevel(logging.WARNING)
    server.start([predictor])
    log.info("server stopped")
