"""Measure ``vaecf serve`` from the outside: a real server process, real HTTP clients.

``ServerProcess`` starts ``vaecf serve`` on free loopback ports and stops it with SIGTERM
(the tests use it too); ``load`` runs closed-loop clients (each sends its next request when
the previous one is answered) for a fixed time and reports latency percentiles, users/s and
errors; ``Hostile`` runs a huge-header client and slow (slowloris) connections beside them;
``in_process_rate`` times the same signature called in this process, the ceiling the server
is compared with.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vaecf.errors import VaecfError

HOST = "127.0.0.1"  # KServe binds every interface; clients only ever use loopback


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    """``vaecf serve --model MODEL`` as a child process on free loopback ports.

    ``start`` returns once the server answers readiness (the model is loaded and warmed up);
    ``stop`` sends SIGTERM and waits for the exit status.
    """

    model: str
    args: tuple[str, ...] = ()  # further ``vaecf serve`` flags
    startup_timeout: float = 180.0
    http_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    def start(self, log_path: Path) -> None:
        self.log_path = log_path
        command = [sys.executable, "-m", "vaecf.cli", "serve", "--model", self.model,
                   "--http_port", str(self.http_port), "--grpc_port", str(self.grpc_port),
                   *self.args]
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            env=os.environ.copy())
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise VaecfError(f"vaecf serve exited with {self.process.returncode} before "
                                 f"it was ready: {self.log_tail()}")
            if request(self.url, "GET", "/v2/health/ready", timeout=2)[0] == 200:
                return
            time.sleep(0.25)
        self.stop()
        raise VaecfError(f"vaecf serve was not ready within {self.startup_timeout:g} s")

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then the exit status (the server drains in-flight requests first)."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def log_tail(self, lines: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def rss_bytes(self) -> int:
        import psutil

        assert self.process is not None
        return int(psutil.Process(self.process.pid).memory_info().rss)


def request(url: str, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None, timeout: float = 30.0
            ) -> tuple[int, bytes]:
    """One HTTP request on a new connection; ``(0, b"")`` if nothing answers."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    except OSError:
        return 0, b""
    finally:
        connection.close()


def v1_body(users: list[list[str]], k: int = 20) -> bytes:
    return json.dumps({"instances": [{"items": items, "k": k} for items in users]}).encode()


@dataclass(frozen=True)
class LoadResult:
    """What ``clients`` closed-loop clients saw in ``seconds``."""

    clients: int
    users_per_request: int
    seconds: float
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    users_per_second: float

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def load(url: str, path: str, bodies: list[bytes], users_per_request: int, clients: int,
         seconds: float) -> LoadResult:
    """``clients`` threads, each with a keep-alive connection, sending ``bodies`` in turn."""
    host, port = url.removeprefix("http://").split(":")
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    stop_at = time.monotonic() + seconds

    def client(index: int) -> None:
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        headers = {"Content-Type": "application/json"}
        sent = index
        while time.monotonic() < stop_at:
            body = bodies[sent % len(bodies)]
            sent += clients
            started = time.perf_counter()
            try:
                connection.request("POST", path, body=body, headers=headers)
                response = connection.getresponse()
                response.read()
                ok = response.status == 200
            except OSError:
                ok = False
                connection.close()
            latencies[index].append(time.perf_counter() - started)
            errors[index] += not ok
        connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    every = np.array([value for per_client in latencies for value in per_client]) * 1000
    done = every.size - sum(errors)
    return LoadResult(clients=clients, users_per_request=users_per_request,
                      seconds=round(elapsed, 2), requests=int(every.size), errors=sum(errors),
                      p50_ms=round(float(np.percentile(every, 50)), 2) if every.size else 0.0,
                      p99_ms=round(float(np.percentile(every, 99)), 2) if every.size else 0.0,
                      users_per_second=round(done * users_per_request / elapsed, 1))


class Hostile:
    """Misbehaving clients beside the normal ones, while the ``with`` block runs.

    One thread sends huge headers back to back (one header line of up to ``huge_bytes`` on
    each connection, as fast as the server takes it); another keeps ``slow`` connections open
    that send one header line a second and never finish their request (slowloris).
    """

    def __init__(self, url: str, huge_bytes: int = 128 * 2**20, slow: int = 32) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.address = (host, int(port))
        self.huge_bytes, self.slow = huge_bytes, slow
        self.huge_headers = self.huge_bytes_sent = self.slow_connections = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._huge), threading.Thread(target=self._slow)]

    def __enter__(self) -> Hostile:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def as_dict(self) -> dict[str, int]:
        return {"huge_headers": self.huge_headers, "huge_bytes_sent": self.huge_bytes_sent,
                "slow_connections": self.slow_connections}

    def _huge(self) -> None:
        chunk = b"a" * 2**16
        while not self._stop.is_set():
            sent = 0
            try:
                with socket.create_connection(self.address, timeout=5) as sock:
                    sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nX-Huge: ")
                    while sent < self.huge_bytes and not self._stop.is_set():
                        sock.sendall(chunk)
                        sent += len(chunk)
            except OSError:
                pass  # the server cut it off (or stopped reading for 5 s)
            self.huge_headers += 1
            self.huge_bytes_sent += sent

    def _slow(self) -> None:
        open_: list[socket.socket] = []
        while not self._stop.is_set():
            while len(open_) < self.slow:
                try:
                    sock = socket.create_connection(self.address, timeout=5)
                    sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\n")
                except OSError:
                    break
                open_.append(sock)
                self.slow_connections += 1
            for sock in list(open_):
                try:
                    sock.sendall(b"X-Slow: a\r\n")
                except OSError:  # the server closed it
                    open_.remove(sock)
                    sock.close()
            self._stop.wait(1.0)
        for sock in open_:
            sock.close()


def in_process_rate(model: Any, users: list[list[str]], k: int, seconds: float) -> float:
    """Users/s of ``model.recommend`` on ``users`` (one call each time), in this process."""
    model.recommend(users, [k] * len(users))  # warm-up
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        model.recommend(users, [k] * len(users))
        calls += 1
    return calls * len(users) / (time.perf_counter() - started)
