"""Connecting to the Kubernetes API, and calling it the way a real cluster needs.

Every call goes through ``call``: it carries a client-side timeout (a silent network
partition must not hold a step past its deadline), retries what a real API server does when
it restarts or is overloaded (connection refused or reset, a timeout, HTTP 429/5xx, honouring
``Retry-After``) with backoff within a time budget, and turns every failure into one line
(``ApiError``) instead of a client traceback or an HTTP dump.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

from vaecf import log
from vaecf.errors import VaecfError

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
REQUEST_TIMEOUT = 30.0  # seconds to connect and between the bytes of an answer
RETRIED_STATUS = {408, 429, 500, 502, 503, 504}  # the server restarts, is overloaded or slow
# A restarted kube-apiserver answers 401/403 for a moment, until its authentication and RBAC
# caches are synced: a call that was granted before in this step is retried that long.
REFUSED_STATUS = {401, 403}
REFUSAL_GRACE = 30.0
MAX_BACKOFF = 30.0
MIN_WAIT = 0.1  # the shortest per-request timeout a nearly spent budget still allows


class ApiError(VaecfError):
    """A call that failed for good; ``status`` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def api_client() -> Any:
    """An ``ApiClient``: in-cluster credentials in a pod, else ``$KUBECONFIG``/~/.kube.

    urllib3's own retries are off (they retry at once, without backoff, and a stalled read
    three times over): ``call`` retries instead."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:  # read $KUBECONFIG now: the client reads it once, when it is first imported
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"),
                                    client_configuration=configuration)
    except config.ConfigException as err:
        raise VaecfError(f"no Kubernetes credentials: {err}") from err
    configuration.retries = False
    return client.ApiClient(configuration)


def connection_cutter(api: Any) -> Callable[[], None]:
    """Keep track of every connection ``api`` (an ``ApiClient``) opens from now on; returns
    what shuts them all down, so that every read waiting on one (a watch, a request waiting
    for its answer, in any thread) returns at once, and the next request opens a new one.

    What a cancelled context does to a Go client's requests. Safe in a signal handler: a
    system call per socket, no lock taken, nothing raised.
    """
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    # while a socket exists: a streamed answer keeps its own after the connection lets go
    sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()

    def tracked(pool: Any) -> Any:
        base: Any = pool.ConnectionCls

        class Connection(base):
            def connect(self) -> None:
                super().connect()
                sockets.add(self.sock)

        return type(pool.__name__, (pool,), {"ConnectionCls": Connection})

    manager = api.rest_client.pool_manager
    manager.clear()  # a pool made before would keep its untracked connections
    manager.pool_classes_by_scheme = {"http": tracked(HTTPConnectionPool),
                                      "https": tracked(HTTPSConnectionPool)}

    def cut() -> None:
        for sock in list(sockets):
            with suppress(OSError):  # socket.socket's own: an SSLSocket's drops its TLS state
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    return cut


def current_namespace() -> str:
    """The pod's own namespace (where KFP runs the step), else ``default``."""
    if SERVICE_ACCOUNT_NAMESPACE.is_file():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    return "default"


def status_message(body: Any) -> str:
    """The ``message`` of a Kubernetes ``Status`` (an error's body), else ``""``."""
    try:
        status = json.loads(body) if isinstance(body, (str, bytes)) else body
    except ValueError:
        return ""
    message = status.get("message", "") if isinstance(status, dict) else ""
    return " ".join(str(message).split())[:400]


def describe(err: Exception) -> tuple[int | None, str]:
    """``(HTTP status or None, one line)`` for what a call raised."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(err, ApiException):
        message = status_message(err.body)
        return err.status, f"HTTP {err.status} {err.reason}" + (f": {message}" if message
                                                               else "")
    text = re.sub(r"^.*?\(host=.*?, port=\d+\): |\s*\(read timeout=.*?\)", "",
                  " ".join(str(err).split()))
    return None, f"no answer ({type(err).__name__}: {text[:200]})"


def retry_after(err: Exception) -> float | None:
    """The server's ``Retry-After`` (header, or ``details.retryAfterSeconds``), in seconds."""
    headers = getattr(err, "headers", None) or {}
    if headers.get("Retry-After", "").isdigit():
        return float(headers["Retry-After"])
    try:
        seconds = json.loads(getattr(err, "body", None) or "{}")["details"]["retryAfterSeconds"]
        return float(seconds)
    except (ValueError, KeyError, TypeError):
        return None


def transient_status(status: int | None) -> bool:
    """Whether retrying may help: no answer at all (None), or a status a restarting or
    overloaded server gives."""
    return status is None or status in RETRIED_STATUS


def backoff(attempt: int, hint: float | None = None) -> float:
    """Seconds before retry ``attempt`` (0-based): the server's hint, else 1, 2, 4... 30."""
    return hint if hint is not None else min(MAX_BACKOFF, 2.0 ** attempt)


def call(what: str, fn: Callable[..., Any], *args: Any, budget: float,
         timeout: float | tuple[float, float] = REQUEST_TIMEOUT, granted: bool = False,
         sleep: Callable[[float], None] | None = None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with a client-side ``timeout``, retried while transient.

    Args:
      what: names the call in messages, e.g. ``"mpijob team-a/x: get"``.
      budget: seconds within which transient failures are retried (backoff included);
        the last failure is raised once it is spent. No request waits past it: a frozen
        connection ends the call when the budget does (``budget=0``: one attempt, waiting
        ``timeout``).
      timeout: seconds to connect and to wait for each read, or ``(connect, read)``.
      granted: the same call succeeded before in this step, so a 401/403 is a restarting
        API server's (``REFUSAL_GRACE``), not the step's Role.
      sleep: waits between the attempts (``time.sleep``; a step that can be cancelled
        passes one that ends early and raises, ``vaecf.k8s.job.CancelRequest.sleep``).

    Raises:
      ApiError: a failure that retrying cannot help, or the last one within ``budget``.
    """
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    limits = timeout if isinstance(timeout, tuple) else (timeout, timeout)
    started = time.monotonic()
    give_up = started + budget
    for attempt in range(1_000_000):
        left = give_up - time.monotonic()
        waits = limits if budget <= 0 else tuple(max(MIN_WAIT, min(t, left)) for t in limits)
        try:
            return fn(*args, _request_timeout=waits, **kwargs)
        except (ApiException, HTTPError, OSError) as err:
            status, line = describe(err)
            pause = backoff(attempt, retry_after(err))
            refused = granted and status in REFUSED_STATUS and \
                time.monotonic() - started < REFUSAL_GRACE
            if not (transient_status(status) or refused) or time.monotonic() + pause > give_up:
                raise ApiError(f"{what} failed: {line}", status) from None
            log.info(f"{what}: {line}; retrying in {pause:g} s")
            (sleep or time.sleep)(pause)
    raise AssertionError("unreachable")


def warnings(headers: Any) -> list[str]:
    """The texts of an answer's ``Warning`` headers (``299 - "text"``, RFC 7234)."""
    values = headers.getlist("Warning") if hasattr(headers, "getlist") else []
    texts = []
    for value in values:
        code, _, rest = value.partition(" ")
        _, _, text = rest.partition(" ")
        texts.append(text.strip().strip('"') if code.isdigit() else value)
    return texts


def send(what: str, fn: Callable[..., Any], *args: Any, budget: float,
         timeout: float | tuple[float, float] = REQUEST_TIMEOUT, **kwargs: Any) -> Any:
    """A create or patch (``fn`` a ``*_with_http_info`` method): fields the server does not
    know are refused (``fieldValidation=Strict``, as ``kubectl apply`` does), and the
    server's warnings are logged. Returns the object the server answered."""
    body, _, headers = call(what, fn, *args, budget=budget, timeout=timeout,
                            field_validation="Strict", **kwargs)
    for text in warnings(headers):
        log.info(f"{what}: the API server warns: {text}")
    return body


def lines(response: Any) -> Iterator[bytes]:
    """The lines of a streamed answer (a watch, a log), without their newline."""
    pending = b""
    for chunk in response.stream(4096):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from complete
    if pending:
        yield pending
