"""Real HTTP servers on loopback: one serving fixture files (download tests), and the base of
the fake JSON APIs (``k8s/fake_apiserver.py``, ``pipelines/fake_kfp_api.py``).

``/plain/<name>`` serves a file (with HTTP ``Range`` support), ``/drop/<name>`` cuts its first
response after a third of the body (``/norange/<name>`` too, and it ignores Range
requests), ``/flaky/<name>`` answers 503 once; every request's path
and Range header are logged in ``server.requests``. Test modules use it with
a fixture that does ``yield from serve()``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

S = TypeVar("S", bound=ThreadingHTTPServer)


@dataclass
class Request:
    """One request a fake API received, for tests to assert on."""

    method: str
    path: str
    query: dict[str, str]
    body: dict[str, Any] | None = None


class JsonHandler(BaseHTTPRequestHandler):
    """Base of the fake APIs' handlers: records every request, answers JSON."""

    def recorded(self) -> list[Request]:
        """Where this server keeps the requests it received."""
        raise NotImplementedError

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass

    def _record(self, body: dict[str, Any] | None = None) -> Request:
        url = urlsplit(self.path)
        request = Request(self.command, url.path,
                          {k: v[0] for k, v in parse_qs(url.query).items()}, body)
        self.recorded().append(request)
        return request

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class FixtureServer(ThreadingHTTPServer):
    """Serves ``files``; ``/drop/<name>`` cuts the first response midway, ``/flaky/<name>``
    answers 503 once, and every request's Range header is logged."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.failed: set[str] = set()


class Handler(BaseHTTPRequestHandler):
    server: FixtureServer

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.requests.append((self.path, self.headers.get("Range")))
        mode, _, name = self.path.strip("/").rpartition("/")
        data = self.server.files.get(name)
        if data is None:
            self.send_error(404)
            return
        first = self.path not in self.server.failed
        self.server.failed.add(self.path)
        if mode == "flaky" and first:
            self.send_error(503)
            return
        ranged = self.headers.get("Range") and mode != "norange"
        start = int(self.headers["Range"].split("=")[1].rstrip("-")) if ranged else 0
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        body = data[start:]
        if mode in ("drop", "norange") and first:
            self.wfile.write(body[: len(body) // 3])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)


def in_thread(server: S) -> Iterator[S]:
    """Run ``server`` in a thread for the duration of a fixture (``yield from``)."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def serve() -> Iterator[FixtureServer]:
    """Run a ``FixtureServer`` in a thread for the duration of a fixture."""
    yield from in_thread(FixtureServer())


def url(server: FixtureServer, path: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/{path}"
