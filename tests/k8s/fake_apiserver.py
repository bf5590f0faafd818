"""A small, real Kubernetes API server on loopback: just what ``vaecf launch-mpijob`` and
``vaecf deploy`` call.

It speaks plain HTTP on 127.0.0.1 to the real ``kubernetes`` client: create/get/delete of
MPIJobs, the MPIJob watch (one JSON event per line), pod list by label and a pod log stream;
get, create and merge-patch of InferenceServices.
A ``Scenario`` scripts what the watched job goes through; every request is recorded so tests
can assert on what the launcher sent (e.g. the DELETE after SIGTERM).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from loopback_http import JsonHandler, Request

MPIJOBS = "/apis/kubeflow.org/v2beta1/namespaces/{ns}/mpijobs"
LAUNCHER_POD = "{name}-launcher"


@dataclass
class Scenario:
    """What the cluster does with the job: its states in order, then (maybe) nothing more."""

    states: list[str] = field(default_factory=lambda: ["Running", "Succeeded"])
    hold_watch: bool = False  # keep the watch open after the last state (timeout, SIGTERM)
    log_lines: list[str] = field(default_factory=list)
    existing: dict[str, Any] | None = None  # a job created by an earlier attempt
    events: list[dict[str, Any]] = field(default_factory=list)
    on_create: Callable[[dict[str, Any]], None] | None = None  # plays the trainer's part


class FakeCluster:
    """State of the fake cluster, shared by the handler threads."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.jobs: dict[str, dict[str, Any]] = {}
        self.services: dict[str, dict[str, Any]] = {}  # InferenceServices by name
        self.requests: list[Request] = []
        self.stop = threading.Event()
        self.watching = threading.Event()
        if scenario.existing is not None:
            self.jobs[scenario.existing["metadata"]["name"]] = scenario.existing

    def seen(self, method: str, suffix: str = "") -> list[Request]:
        return [r for r in self.requests if r.method == method and r.path.endswith(suffix)]

    def set_state(self, name: str, state: str) -> dict[str, Any]:
        job = self.jobs[name]
        message = "launcher exited with code 1" if state == "Failed" else f"job is {state}"
        job.setdefault("status", {})["conditions"] = [
            {"type": state, "status": "True", "reason": f"MPIJob{state}", "message": message}]
        return job


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class Handler(JsonHandler):
    cluster: FakeCluster  # set on the subclass made per server

    def recorded(self) -> list[Request]:
        return self.cluster.requests

    def _status(self, code: int, reason: str) -> None:
        self._json(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                          "reason": reason, "code": code})

    def _stream_start(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Connection", "close")
        self.end_headers()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = self._record(body)
        name = body["metadata"]["name"]
        if request.path.endswith("/inferenceservices"):
            if name in self.cluster.services:
                return self._status(409, "AlreadyExists")
            self.cluster.services[name] = body
            return self._json(201, body)
        if name in self.cluster.jobs:
            return self._status(409, "AlreadyExists")
        body["metadata"]["resourceVersion"] = "1"
        self.cluster.jobs[name] = body
        if self.cluster.scenario.on_create is not None:
            self.cluster.scenario.on_create(body)
        self._json(201, body)

    def do_DELETE(self) -> None:
        request = self._record()
        name = request.path.rsplit("/", 1)[-1]
        if self.cluster.jobs.pop(name, None) is None:
            return self._status(404, "NotFound")
        self._json(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

    def do_GET(self) -> None:
        request = self._record()
        parts = request.path.strip("/").split("/")
        if request.path.endswith("/mpijobs") and request.query.get("watch", "").lower() == "true":
            return self._watch(request)
        if len(parts) == 7 and parts[5] == "inferenceservices":
            service = self.cluster.services.get(parts[6])
            return self._json(200, service) if service else self._status(404, "NotFound")
        if len(parts) == 7 and parts[5] == "mpijobs":
            job = self.cluster.jobs.get(parts[6])
            return self._json(200, job) if job else self._status(404, "NotFound")
        if request.path.endswith("/pods"):
            return self._pods(parts[3])
        if request.path.endswith("/log"):
            return self._log()
        if request.path.endswith("/events"):
            return self._json(200, {"kind": "EventList", "apiVersion": "v1", "metadata": {},
                                    "items": self.cluster.scenario.events})
        self._status(404, "NotFound")

    def do_PATCH(self) -> None:
        """A JSON merge patch (RFC 7386) of an InferenceService."""
        assert self.headers["Content-Type"] == "application/merge-patch+json"
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = self._record(body)
        name = request.path.rsplit("/", 1)[-1]
        if name not in self.cluster.services:
            return self._status(404, "NotFound")
        self.cluster.services[name] = merge_patch(self.cluster.services[name], body)
        self._json(200, self.cluster.services[name])

    def _watch(self, request: Request) -> None:
        name = request.query.get("fieldSelector", "").removeprefix("metadata.name=")
        self._stream_start("application/json")
        self.cluster.watching.set()
        if name not in self.cluster.jobs:
            return
        for version, state in enumerate(self.cluster.scenario.states, start=2):
            job = self.cluster.set_state(name, state)
            job["metadata"]["resourceVersion"] = str(version)
            event = json.dumps({"type": "MODIFIED", "object": job}) + "\n"
            self.wfile.write(event.encode())
            self.wfile.flush()
        if self.cluster.scenario.hold_watch:
            self.cluster.stop.wait(float(request.query.get("timeoutSeconds", "60")))

    def _pods(self, namespace: str) -> None:
        items = [{"metadata": {"name": LAUNCHER_POD.format(name=name), "namespace": namespace},
                  "status": {"phase": "Running"}} for name in self.cluster.jobs]
        self._json(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                         "items": items})

    def _log(self) -> None:
        self._stream_start("text/plain")
        for line in self.cluster.scenario.log_lines:
            self.wfile.write(line.encode() + b"\n")
            self.wfile.flush()


class FakeApiServer:
    """Runs a ``FakeCluster`` on a free loopback port in a thread."""

    def __init__(self, scenario: Scenario) -> None:
        self.cluster = FakeCluster(scenario)
        handler = type("BoundHandler", (Handler,), {"cluster": self.cluster})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cluster.stop.set()
        self._server.shutdown()
        self._server.server_close()

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig whose only cluster is this server (plain HTTP, a dummy token)."""
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "not-a-secret"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                      "namespace": namespace}}],
        }
        path.write_text(json.dumps(config))
        return path
