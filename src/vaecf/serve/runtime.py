"""KServe's ModelServer with vaecf's edges (imported once ``server.import_kserve`` has run).

- REST runs behind ``gate``: uvicorn's protocol with bounded headers and receive time, and
  the POST checks before a body is read.
- Every bad request is a 4xx ``{"error": "<one line>"}`` and one log line: KServe's schema,
  routing (404, 405) and body errors are rewritten to that form, binary tensors are read by
  ``protocol.read_v2_binary`` (then checked by the same code as gRPC's raw tensors), and the
  tracebacks KServe logs for a client's mistake (REST and gRPC) are cut to their message.
- SIGTERM stops REST and gRPC taking new work at once (KServe stops gRPC only once the REST
  drain is over), and both finish their in-flight requests within the grace period.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kserve
import uvicorn
from fastapi.exceptions import RequestValidationError
from fastapi.responses import ORJSONResponse
from kserve.errors import InvalidInput, ModelNotFound, invalid_input_handler
from kserve.protocol.model_repository_extension import ModelRepositoryExtension
from starlette.exceptions import HTTPException

from vaecf import log
from vaecf.serve.gate import BINARY_HEADER, BoundedHttp, RequestGate
from vaecf.serve.protocol import RequestTooLarge, read_v2_binary


class ModelServer(kserve.ModelServer):
    """``kserve.ModelServer`` with bounded HTTP, checked binary decoding and a joint stop.

    Args:
      max_header_bytes: most bytes of a request line and headers (431 past it).
      request_timeout: seconds a request may take to arrive in full (408 past it).
      grpc_max_receive_bytes: the largest gRPC request (REST's body limit).
      grpc_max_send_bytes: the largest gRPC answer: the largest legal answer's size, so that
        no answer is computed and then cannot be sent.
      kwargs: ``kserve.ModelServer``'s.
    """

    def __init__(self, *, max_header_bytes: int, request_timeout: float,
                 grpc_max_receive_bytes: int, grpc_max_send_bytes: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model_repository_extension = _OneModel(self.registered_models)
        self._http = BoundedHttp.bounded(max_header_bytes, request_timeout)
        self._grpc_options = {"grpc_max_receive_message_length": grpc_max_receive_bytes,
                              "grpc_max_send_message_length": grpc_max_send_bytes}
        self._grpc_stop: asyncio.Task[None] | None = None
        decode = self.dataplane.decode_inference_request

        def checked_decode(body: Any, headers: Any, model_name: str) -> Any:
            if isinstance(body, bytes):  # binary tensors: the gate checked the header length
                return read_v2_binary(body, int(headers[BINARY_HEADER.decode()]), model_name)
            return decode(body, headers, model_name)

        self.dataplane.decode_inference_request = checked_decode

    async def _serve(self) -> None:
        # ``start`` has built KServe's REST server but not run it: its uvicorn server is
        # replaced before it reads its config or installs its signal handlers.
        rest = self._rest_server
        if rest is not None:
            rest.config.http = self._http
            rest._server = _Uvicorn(rest.config, self._stop_grpc)
        if self._grpc_server is not None:  # built, not started: it reads its options at start
            self._grpc_server._kwargs = {**self._grpc_server._kwargs, **self._grpc_options}
        await super()._serve()

    def _stop_grpc(self) -> None:
        if self._grpc_server is None or self._grpc_stop is not None:
            return
        loop = asyncio.get_running_loop()
        grpc_server = self._grpc_server

        def stop() -> None:
            log.info("SIGTERM: gRPC takes no new calls; in-flight calls finish")
            self._grpc_stop = loop.create_task(grpc_server.stop())

        loop.call_soon_threadsafe(stop)  # we are in a signal handler


class _OneModel(ModelRepositoryExtension):
    """KServe's model repository, without its load and unload: the one model is loaded at
    start, and no client may unload it (gRPC's RepositoryModelUnload; REST's repository
    paths are unknown paths, ``gate.NOT_SERVED``)."""

    async def load(self, model_name: str) -> None:
        raise InvalidInput(f"{model_name}: models are not loaded by request here")

    async def unload(self, model_name: str) -> None:
        raise InvalidInput(f"{model_name}: models are not unloaded by request here")


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, whose first exit signal also calls ``on_exit``."""

    def __init__(self, config: uvicorn.Config, on_exit: Any) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        self._on_exit()


class _OneLine(logging.Filter):
    """KServe logs a client's mistake with its traceback: keep the message, drop the rest."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, (InvalidInput, ModelNotFound)):
            if record.msg == "Exception:":  # KServe's REST handlers' whole message
                record.msg, record.args = f"refused: {error}", ()
            record.exc_info, record.exc_text = None, None
        return True


def install(app: Any, max_body_bytes: int) -> None:
    """The gate in front of KServe's app; every error a client causes as a one-line 4xx."""

    async def schema_error(_: Any, exc: RequestValidationError) -> ORJSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            message = f"request body: malformed JSON ({first.get('ctx', {}).get('error')})"
        else:
            where = ".".join(str(part) for part in first.get("loc", ())
                             if part not in ("body", "InferenceRequest"))
            message = f"{where or 'request body'}: {first.get('msg', 'invalid request')}"
        log.warning(f"refused 400: {message}")
        return ORJSONResponse(status_code=400, content={"error": message})

    async def http_error(request: Any, exc: HTTPException) -> ORJSONResponse:
        message = f"{request.method} {request.url.path}: {exc.detail}"
        log.warning(f"refused {exc.status_code}: {message}")
        return ORJSONResponse(status_code=exc.status_code, content={"error": message},
                              headers=exc.headers)

    async def too_large(request: Any, exc: RequestTooLarge) -> Any:
        response = await invalid_input_handler(request, exc)
        response.status_code = 413
        return response

    app.add_middleware(RequestGate, max_body_bytes=max_body_bytes)
    app.add_exception_handler(RequestValidationError, schema_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestTooLarge, too_large)
    logging.getLogger("kserve").addFilter(_OneLine())
