"""What a request must pass before KServe sees it, at the connection and at the request.

``BoundedHttp`` is uvicorn's httptools protocol with the bounds KServe leaves open: the request
line and headers are at most ``max_header_bytes`` (431), and a request must arrive in full,
headers and body, within ``request_timeout`` seconds of its first byte (408); a connection
that sends nothing is closed after that time too, and so is one whose client stops reading
its answer for that time (an unread answer cannot hold the server's memory). One slow or huge
client then holds a connection for a bounded time and the event loop for a bounded number of
bytes, and the other clients are not held up (``vaecf benchmark-serve`` measures it).
Unparseable HTTP gets the same JSON 400 as every other refusal.

``RequestGate`` (ASGI middleware) checks a POST's headers before its body is read: a content
type that is JSON, none (tritonclient and KServe's own REST clients send none) or, on v2
infer, the binary tensor extension (``Inference-Header-Content-Length``, as KServe's model
servers accept it); a Content-Length within ``max_body_bytes``. It then reads the body and
hands KServe the request with the content type KServe needs to route it (see ``_kserve_type``).
Every refusal is ``{"error": "<one line>"}`` and one log line, never a traceback. The KServe
paths vaecf does not serve (``NOT_SERVED``) are refused here as unknown paths (404), whatever
the method.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from vaecf import log
from vaecf.serve import heap

BINARY_HEADER = b"inference-header-content-length"
# KServe routes vaecf does not serve, answered as unknown paths: model versions (KServe
# answers them 501 with a traceback) and the model repository's load and unload (any client
# could unload the one model, and the server would then answer nothing).
NOT_SERVED = re.compile(r"^/v2/(models/[^/]+/versions(/|$)|repository(/|$))")


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


class BoundedHttp(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol, with the request's size and arrival time bounded.

    ``bounded(max_header_bytes, request_timeout)`` gives the class uvicorn instantiates per
    connection (``uvicorn.Config(http=...)``).
    """

    max_header_bytes: int  # set by ``bounded``
    request_timeout: float

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0  # bytes received of the current request's line and headers
        self._in_head = True
        self._deadline: asyncio.TimerHandle | None = None
        self._unread: asyncio.TimerHandle | None = None  # an answer the client is not taking
        self._refused = False

    @classmethod
    def bounded(cls, max_header_bytes: int, request_timeout: float) -> type[BoundedHttp]:
        return type("BoundedHttp", (cls,), {"max_header_bytes": max_header_bytes,
                                            "request_timeout": request_timeout})

    # The clock runs from a connection's opening or a request's first byte to its last byte.
    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.request_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.resume_writing()
        super().connection_lost(exc)

    # An answer's bytes wait in the connection's write buffer while the client does not read;
    # the buffer staying over its high-water mark for ``request_timeout`` closes the connection.
    def pause_writing(self) -> None:
        super().pause_writing()
        if self._unread is None:
            self._unread = self.loop.call_later(self.request_timeout, self._not_read)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._unread is not None:
            self._unread.cancel()
            self._unread = None

    def _not_read(self) -> None:
        self._unread = None
        client = f" {self.client[0]}:{self.client[1]}" if self.client else ""
        log.warning(f"closed{client}: answer not read for {self.request_timeout:g} s")
        self.transport.abort()  # frees the buffer; the app sees a disconnect

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._arm()
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.max_header_bytes and not self._refused:
            self._refuse(431, f"request line and headers over {self.max_header_bytes:,} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._in_head = False
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.max_header_bytes:
            self._refuse(431, f"request line and headers of {size:,} bytes, over the limit "
                              f"of {self.max_header_bytes:,}")
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._disarm()
        self._in_head, self._head_bytes = True, 0
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:  # unparseable HTTP; uvicorn logged it
        if not self._refused:
            self._refuse(400, "malformed HTTP request", logged=True)

    def _too_slow(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self._refuse(408, f"request not received in full within {self.request_timeout:g} s")

    def _refuse(self, status: int, message: str, logged: bool = False) -> None:
        """Answer ``status`` and close; a request the app waits on sees a disconnect."""
        self._refused = True
        self._disarm()
        if not logged:
            client = f"{self.client[0]}:{self.client[1]} " if self.client else ""
            log.warning(f"refused {client}{status}: {message}")
        cycle = self.cycle
        if cycle is None or cycle.response_complete or not cycle.response_started:
            body = error_body(message)
            self.transport.write(b"".join([
                STATUS_LINE[status], b"content-type: application/json\r\n",
                b"content-length: ", str(len(body)).encode(), b"\r\n",
                b"connection: close\r\n\r\n", body]))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()


class RequestGate:
    """ASGI middleware in front of KServe's app: a POST's headers, then its body, checked.

    Args:
      app: KServe's FastAPI app.
      max_body_bytes: the largest Content-Length accepted (413 past it, before the body).
    """

    def __init__(self, app: Any, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and NOT_SERVED.match(scope["path"]):
            return await refuse(send, 404, f"{scope['method']} {scope['path']}: Not Found")
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        refusal = self.refusal(scope["path"], headers)
        if refusal is not None:
            return await refuse(send, *refusal)
        body = await _read(receive)
        if body is None:  # the client went away or was too slow (``BoundedHttp`` answered)
            return None
        headers[b"content-type"] = _kserve_type(scope["path"], headers)
        scope = {**scope, "headers": list(headers.items())}
        sent, answered = False, 0

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def counted(message: dict[str, Any]) -> None:
            nonlocal answered
            answered += len(message.get("body", b""))
            await send(message)

        await self.app(scope, replay, counted)
        if len(body) + answered >= heap.GIVE_BACK_BYTES:  # its objects are freed by now
            heap.give_back()

    def refusal(self, path: str, headers: dict[bytes, bytes]) -> tuple[int, str] | None:
        kind = _media_type(headers)
        binary = BINARY_HEADER in headers
        if binary and not path.endswith("/infer"):
            return 400, f"{BINARY_HEADER.decode()}: binary tensors are for v2 infer only"
        if kind not in (b"", b"application/json") and not (
                binary and kind == b"application/octet-stream"):
            expected = ("application/json, or application/octet-stream with "
                        "Inference-Header-Content-Length" if path.endswith("/infer")
                        else "application/json")
            return 415, f"Content-Type: expected {expected}, got {kind.decode('latin-1')!r}"
        length = headers.get(b"content-length")
        if length is None:
            return 411, "Content-Length: required (chunked request bodies are not accepted)"
        if not length.isdigit():
            return 400, "Content-Length: expected a number of bytes"
        if int(length) > self.max_body_bytes:
            return 413, (f"request body of {int(length):,} bytes, over the limit of "
                         f"{self.max_body_bytes:,}")
        if binary and not (headers[BINARY_HEADER].isdigit()
                           and int(headers[BINARY_HEADER]) <= int(length)):
            return 400, (f"{BINARY_HEADER.decode()}: expected the JSON header's length in "
                         f"bytes, at most the Content-Length {int(length):,}")
        return None


def _media_type(headers: dict[bytes, bytes]) -> bytes:
    return headers.get(b"content-type", b"").split(b";")[0].strip().lower()


def _kserve_type(path: str, headers: dict[bytes, bytes]) -> bytes:
    """The content type that routes a checked body through KServe to vaecf's parsers.

    v2 binary tensors: ``application/octet-stream`` (FastAPI then passes the bytes to KServe's
    binary decoder, which needs the Inference-Header-Content-Length header). Any other v2 body
    is JSON for the Open Inference Protocol schema. A v1 body: ``application/json;
    charset=utf-8``, which KServe does not parse itself (it matches a bare
    ``application/json`` only) and passes on as bytes to ``protocol.parse_v1``.
    """
    if path.endswith("/infer"):
        return b"application/octet-stream" if BINARY_HEADER in headers else b"application/json"
    return b"application/json; charset=utf-8"


async def _read(receive: Any) -> bytes | None:
    """The whole body (its length was checked from the headers), None on a disconnect."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def refuse(send: Any, status: int, message: str) -> None:
    """Answer ``{"error": message}`` with ``status``, close the connection, log one line."""
    log.warning(f"refused {status}: {message}")
    body = error_body(message)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
