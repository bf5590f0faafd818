"""A small KFP API server (v2beta1) on loopback: what ``kfp run submit -f FILE`` calls.

The real ``kfp`` CLI talks plain HTTP to it: healthz, experiments list/create, runs create/get
(``-f`` sends the compiled spec inside the run, so nothing is uploaded). Creating a run checks
``runtime_config.parameters`` against the spec's ``root.inputDefinitions.parameters`` as the
KFP backend does (``validatePipelineJobInputs`` in kubeflow/pipelines
``backend/src/apiserver/template/v2_template.go``) and answers 400 with its message otherwise.
Every request is recorded so tests can assert on what the CLI sent.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

from loopback_http import JsonHandler, Request, in_thread

API = "/apis/v2beta1"
CREATED_AT = "2026-01-01T00:00:00Z"
# Per declared type: the JSON kinds a google.protobuf.Value of that type decodes from, and the
# rest of the backend's message when the value has another kind.
NUMBER = ((int, float), "double or integer, but the parameter value is not of number value type")
EXPECTED: dict[str, tuple[tuple[type, ...], str]] = {
    "NUMBER_DOUBLE": NUMBER, "NUMBER_INTEGER": NUMBER,
    "STRING": ((str,), "string, but the input parameter is not of string value type"),
    "BOOLEAN": ((bool,), "bool, but the input parameter is not of bool value type"),
    "LIST": ((list,), "list, but the input parameter is not of list value type"),
    "STRUCT": ((dict,), "struct, but the input parameter is not of struct value type")}


def validate_inputs(declared: dict[str, Any], given: dict[str, Any]) -> str | None:
    """The backend's check of a run's parameters: its error message, or ``None`` if accepted.

    Args:
      declared: ``root.inputDefinitions.parameters`` of the pipeline spec.
      given: ``runtime_config.parameters`` of the run, as decoded from JSON.
    """
    for name, spec in declared.items():
        if name not in given:
            if not spec.get("isOptional") and "defaultValue" not in spec:
                return f"parameter {name} is not optional, yet has neither default value " \
                       "nor user provided value"
            continue
        kind = spec.get("parameterType")
        if kind not in EXPECTED:
            return f"input parameter {name} requires type {kind or 'unspecified'}"
        kinds, message = EXPECTED[kind]
        value = given[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            return f"input parameter {name} requires type {message}"
    extra = sorted(set(given) - set(declared))
    return f"parameter(s) provided are not required by pipeline: {', '.join(extra)}" \
        if extra else None


class FakeKfp(ThreadingHTTPServer):
    """State of the fake KFP deployment, shared by the handler threads."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.experiments: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, dict[str, Any]] = {}
        self.refused: list[tuple[dict[str, Any], str]] = []  # (run body, backend's message)
        self.requests: list[Request] = []
        self.ids = itertools.count(1)
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(JsonHandler):
    server: FakeKfp

    def recorded(self) -> list[Request]:
        return self.server.requests

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message, "code": 3 if status == 400 else 5,
                            "message": message, "details": []})

    def do_GET(self) -> None:
        request = self._record()
        if request.path == f"{API}/healthz":
            self._json(200, {"multi_user": False})
        elif request.path == f"{API}/experiments":
            wanted = json.loads(request.query.get("filter", '{"predicates": []}'))
            names = {p["stringValue"] for p in wanted["predicates"]
                     if p["key"] == "display_name"}
            found = [e for e in self.server.experiments.values()
                     if not names or e["display_name"] in names]
            self._json(200, {"experiments": found, "total_size": len(found)})
        elif request.path.startswith(f"{API}/runs/") and \
                request.path.rsplit("/", 1)[1] in self.server.runs:
            self._json(200, self.server.runs[request.path.rsplit("/", 1)[1]])
        else:
            self._error(404, f"no such resource: {request.path}")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        request = self._record(body)
        with self.server.lock:
            number = next(self.server.ids)
        if request.path == f"{API}/experiments":
            experiment = {**body, "experiment_id": f"experiment-{number}",
                          "created_at": CREATED_AT, "storage_state": "AVAILABLE"}
            self.server.experiments[experiment["experiment_id"]] = experiment
            self._json(200, experiment)
        elif request.path == f"{API}/runs":
            self._create_run(body, f"run-{number}")
        else:
            self._error(404, f"no such resource: {request.path}")

    def _create_run(self, body: dict[str, Any], run_id: str) -> None:
        spec = body["pipeline_spec"]
        spec = spec.get("pipeline_spec", spec)  # with a platform spec, both are sent
        declared = spec["root"].get("inputDefinitions", {}).get("parameters", {})
        given = body.get("runtime_config", {}).get("parameters") or {}
        problem = validate_inputs(declared, given)
        if problem is not None:
            self.server.refused.append((body, problem))
            self._error(400, f"Failed to create a run: invalid pipeline job inputs: {problem}")
            return
        run = {**body, "run_id": run_id, "state": "PENDING", "created_at": CREATED_AT,
               "storage_state": "AVAILABLE"}
        self.server.runs[run_id] = run
        self._json(200, run)


def serve() -> Iterator[FakeKfp]:
    """Run a ``FakeKfp`` in a thread for the duration of a fixture."""
    yield from in_thread(FakeKfp())
