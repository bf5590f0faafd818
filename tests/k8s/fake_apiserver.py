"""A small, real Kubernetes API server on loopback: just what ``vaecf launch-mpijob``,
``vaecf launch-sparkapp`` and ``vaecf deploy`` call, behaving as a real one does when things
go wrong.

It speaks plain HTTP on 127.0.0.1 to the real ``kubernetes`` client: create/get/delete of jobs
(MPIJobs, or SparkApplications: ``Scenario.kind``) and their watch (one JSON event per line,
from the ``resourceVersion`` asked for, until ``timeoutSeconds``), pod list by label, a pod
log stream (``container``, ``timestamps``, ``sinceSeconds``), events by field selector; get,
create and merge-patch of InferenceServices. Like a real API server it validates fields
strictly when asked (``fieldValidation=Strict``: jobs against their operator's CRD schema),
answers 409 while a job is being deleted, sends DELETED events, and a ``Scenario`` scripts
what goes wrong: stalls (a request accepted and never answered; ``frozen``: every request,
from the first), a restart (connection refused, then back; after it a burst of 403 while the
RBAC caches sync, and 410 Gone for a watch from a resourceVersion older than the restarted
watch cache), watch ERROR events, a log stream that ends while the pod runs, a sidecar in the
job's main pod (which can keep it running after the main container ended), Warning headers.
Pod templates of SparkApplications are stored as sent, unknown keys and all, as the CRD's
``x-kubernetes-preserve-unknown-fields`` makes a real server do. The operator's part (the
job's states, its pods) is played per kind (``KINDS``).
Every request is recorded so tests can assert on what the launcher sent.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from loopback_http import JsonHandler, Request

SCHEMAS = Path(__file__).resolve().parents[1] / "manifests" / "schemas"
# KServe v1beta1: an InferenceServiceSpec has exactly these components (each a pod-like spec)
INFERENCESERVICE_SCHEMA: dict[str, Any] = {"type": "object", "properties": {
    "apiVersion": {}, "kind": {}, "metadata": {"x-kubernetes-preserve-unknown-fields": True},
    "status": {"x-kubernetes-preserve-unknown-fields": True},
    "spec": {"type": "object", "properties": {
        part: {"x-kubernetes-preserve-unknown-fields": True}
        for part in ("predictor", "explainer", "transformer")}}}}
STEP_SECONDS = 0.05  # between two states of a job


@dataclass(frozen=True)
class FakeKind:
    """How one operator's jobs look: their API, CRD, states and pods."""

    group: str
    plural: str
    crd: str  # file in tests/manifests/schemas
    terminal: tuple[str, ...]
    failed: tuple[str, ...]
    main_pod: str  # the main pod's name suffix (after "<job>")
    main_container: str
    states: tuple[str, ...]  # what a job goes through by default

    def status(self, name: str, state: str) -> dict[str, Any]:
        failed = state in self.failed
        if self.plural == "mpijobs":
            message = "launcher exited with code 1" if failed else f"job is {state}"
            return {"conditions": [{"type": state, "status": "True",
                                    "reason": f"MPIJob{state}", "message": message}]}
        errors = {"FAILED": "driver container failed with ExitCode: 1, Reason: Error",
                  "SUBMISSION_FAILED": "failed to run spark-submit: exit status 1"}
        applied: dict[str, Any] = {"state": state}
        if state in errors:
            applied["errorMessage"] = errors[state]
        return {"applicationState": applied, "driverInfo": {"podName": f"{name}-driver"}}

    def state(self, job: dict[str, Any]) -> str | None:
        status = job.get("status") or {}
        if self.plural == "mpijobs":
            return ((status.get("conditions") or [{}])[-1]).get("type")
        return (status.get("applicationState") or {}).get("state")

    def pods(self, name: str, job: dict[str, Any], state: str | None,
             sidecar: bool, main_ended: bool = False) -> list[dict[str, Any]]:
        """The job's main pod (launcher, driver) and its workers or executors; with
        ``main_ended``, the main container has terminated and the sidecar runs on."""
        phase = ("Failed" if state in self.failed else "Succeeded") if state in self.terminal \
            else "Running"
        containers = [{"name": self.main_container}] + (
            [{"name": "istio-proxy"}] if sidecar else [])
        main_state = {"terminated": {"exitCode": 0}} if main_ended else {"running": {}}
        statuses = [{"name": self.main_container, "restartCount": 0, "ready": not main_ended,
                     "image": "i", "imageID": "", "state": main_state}]
        if self.plural == "mpijobs":
            labels = {"training.kubeflow.org/job-name": name}
            replicas = job.get("spec", {}).get("mpiReplicaSpecs", {}).get("Worker", {}).get(
                "replicas", 0)
            return [{"metadata": {"name": f"{name}{self.main_pod}", "labels": {
                **labels, "training.kubeflow.org/job-role": "launcher"}},
                "spec": {"containers": containers},
                "status": {"phase": phase, "containerStatuses": statuses}}] + [
                {"metadata": {"name": f"{name}-worker-{i}", "labels": {
                    **labels, "training.kubeflow.org/job-role": "worker"}},
                 "spec": {"containers": [{"name": "worker"}]}, "status": {"phase": "Running"}}
                for i in range(replicas)]
        if state in (None, "", "SUBMITTED", "SUBMISSION_FAILED"):
            return []  # no driver yet, or never
        labels = {"sparkoperator.k8s.io/app-name": name}
        executors = job.get("spec", {}).get("executor", {}).get("instances", 0)
        return [{"metadata": {"name": f"{name}{self.main_pod}", "labels": {
            **labels, "spark-role": "driver"}},
            "spec": {"containers": containers},
            "status": {"phase": phase, "containerStatuses": statuses}}] + [
            {"metadata": {"name": f"{name}-exec-{i}", "labels": {
                **labels, "spark-role": "executor"}},
             "spec": {"containers": [{"name": "spark-kubernetes-executor"}]},
             "status": {"phase": "Running"}}
            for i in range(1, executors + 1) if state not in self.terminal]


KINDS = {
    "mpijobs": FakeKind("kubeflow.org", "mpijobs", "mpijob-crd-v2beta1.yaml",
                        ("Succeeded", "Failed"), ("Failed",), "-launcher-x7k2p", "launcher",
                        ("Running", "Succeeded")),
    "sparkapplications": FakeKind(
        "sparkoperator.k8s.io", "sparkapplications", "sparkapplication-crd-v1beta2.yaml",
        ("COMPLETED", "FAILED", "SUBMISSION_FAILED"), ("FAILED", "SUBMISSION_FAILED"),
        "-driver", "spark-kubernetes-driver", ("SUBMITTED", "RUNNING", "COMPLETED")),
}


@dataclass
class Scenario:
    """What the cluster does with the job and to the step."""

    kind: str = "mpijobs"  # the jobs' plural: mpijobs or sparkapplications (KINDS)
    # the job's states in order once watched (None: the kind's usual ones); "Deleted":
    # someone deletes it (a DELETED event)
    states: list[str] | None = None
    log_lines: list[str] = field(default_factory=list)
    log_drops: list[int] = field(default_factory=list)  # the stream ends after these lines
    sidecar: bool = False  # the launcher pod has a second container (a mesh proxy)
    existing: dict[str, Any] | None = None  # a job created by an earlier attempt
    deletion_seconds: float = 0.0  # how long a deleted job stays (finalizers, pods ending)
    events: list[dict[str, Any]] = field(default_factory=list)
    on_create: Callable[[dict[str, Any]], None] | None = None  # plays the trainer's part
    # requests accepted and never answered, by kind ("watch", "GET", "DELETE", "log", ...)
    stall: dict[str, int] = field(default_factory=dict)
    watch_errors: list[dict[str, Any]] = field(default_factory=list)  # a Status per watch
    restart_at_watch: int | None = None  # this watch (1-based) finds the server restarting
    restart_at_state: str | None = None  # the server restarts once a watch sent this state
    down_seconds: float = 1.5
    # after a restart: requests answered 403 by kind (RBAC caches not synced yet)
    forbidden_after_restart: dict[str, int] = field(default_factory=dict)
    # after a restart the watch cache starts at etcd's current revision: a watch from an
    # older resourceVersion gets ERROR 410
    expire_on_restart: bool = False
    state_seconds: float = STEP_SECONDS  # between two states of the job
    frozen: bool = False  # every request is accepted and never answered, from the first
    main_ended: bool = False  # the main container has ended (a sidecar keeps the pod running)
    warnings: list[str] = field(default_factory=list)  # Warning headers on create/patch


def unknown_field(value: Any, schema: dict[str, Any], path: str = "") -> str | None:
    """The first field of ``value`` its structural ``schema`` does not declare, if any."""
    if schema.get("x-kubernetes-preserve-unknown-fields") or not isinstance(value, (dict, list)):
        return None
    if isinstance(value, list):
        items = schema.get("items", {})
        return next((found for i, item in enumerate(value)
                     if (found := unknown_field(item, items, f"{path}[{i}]"))), None)
    properties, additional = schema.get("properties"), schema.get("additionalProperties")
    if properties is None:
        if isinstance(additional, dict):
            return next((found for key, item in value.items()
                         if (found := unknown_field(item, additional, f"{path}.{key}"))), None)
        if additional or path.endswith("metadata") or not value:
            return None  # a map of anything, or object metadata (checked on its own)
        return f"{path}.{next(iter(value))}"
    for key, item in value.items():
        where = f"{path}.{key}" if path else key
        if key not in properties:
            return where
        if (found := unknown_field(item, properties[key], where)) is not None:
            return found
    return None


@functools.cache
def crd_schema(name: str) -> dict[str, Any]:
    """The openAPIV3Schema of the CRD file ``name`` in tests/manifests/schemas, read once (with
    libyaml when there is one: the SparkApplication CRD is 0.8 MB)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load((SCHEMAS / name).read_text(), Loader=loader)
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeCluster:
    """State of the fake cluster, shared by the handler threads."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.jobs: dict[str, dict[str, Any]] = {}
        self.services: dict[str, dict[str, Any]] = {}  # InferenceServices by name
        self.requests: list[Request] = []
        self.history: list[tuple[int, str, dict[str, Any]]] = []  # (rv, type, job) per change
        self.lock = threading.RLock()
        self.stop = threading.Event()
        self.watching = threading.Event()
        self.log_done = threading.Event()  # the whole log has been sent once
        self.restart: Callable[[float], None] = lambda seconds: None
        self.restart_begun = threading.Event()
        self.generation = 0  # goes up at each restart: open streams end
        self._rv = 1
        self._uids = 0
        self._driven: set[str] = set()
        self._watches = 0
        self._logs = 0
        self._stalls = dict(scenario.stall)
        self._forbidden: dict[str, int] = {}
        self.frozen = scenario.frozen
        self.watch_floor = 0  # the oldest resourceVersion a watch may start from
        self.log_base = datetime.now(UTC) - timedelta(seconds=30)
        self.kind = KINDS[scenario.kind]
        self.job_schema = crd_schema(self.kind.crd)
        if scenario.existing is not None:
            metadata = scenario.existing["metadata"]
            self.jobs[metadata["name"]] = scenario.existing
            if metadata.get("deletionTimestamp"):  # its pods are ending: gone in a moment
                threading.Timer(scenario.deletion_seconds, self._remove,
                                (metadata["name"], metadata["uid"])).start()
        if not scenario.log_lines:
            self.log_done.set()

    def seen(self, method: str, suffix: str = "") -> list[Request]:
        return [r for r in self.requests if r.method == method and r.path.endswith(suffix)]

    def freeze(self) -> None:
        """From now on, every request is accepted and never answered."""
        self.frozen = True

    def restarted(self) -> None:
        """The server came back: the 403 burst begins, and the watch cache starts at etcd's
        revision (which other objects moved on meanwhile)."""
        with self.lock:
            self._forbidden = dict(self.scenario.forbidden_after_restart)
            if self.scenario.expire_on_restart:
                self._rv += 50
                self.watch_floor = self._rv

    def forbidden(self, kind: str) -> bool:
        """Whether this request of ``kind`` is one the restarted server refuses."""
        with self.lock:
            if self._forbidden.get(kind, 0) > 0:
                self._forbidden[kind] -= 1
                return True
        return False

    def stalls(self, kind: str) -> bool:
        """Whether this request of ``kind`` is one the scenario never answers."""
        with self.lock:
            if self.frozen:
                return True
            if self._stalls.get(kind, 0) > 0:
                self._stalls[kind] -= 1
                return True
        return False

    def change(self, kind: str, job: dict[str, Any]) -> None:
        """Record a change of ``job`` (a new resourceVersion, an event for watchers)."""
        with self.lock:
            self._rv += 1
            job["metadata"]["resourceVersion"] = str(self._rv)
            self.history.append((self._rv, kind, json.loads(json.dumps(job))))

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self._uids += 1
            body["metadata"]["uid"] = f"uid-{self._uids}"
            body["metadata"]["creationTimestamp"] = now()
            self.jobs[body["metadata"]["name"]] = body
            self.change("ADDED", body)
        return body

    def set_state(self, name: str, state: str) -> None:
        with self.lock:
            job = self.jobs[name]
            job["status"] = self.kind.status(name, state)
            self.change("MODIFIED", job)

    def delete(self, name: str, seconds: float) -> None:
        """Delete ``name``: at once (a DELETED event), or after ``seconds`` in deletion."""
        with self.lock:
            job = self.jobs[name]
            if seconds <= 0:
                del self.jobs[name]
                self.change("DELETED", job)
                return
            if not job["metadata"].get("deletionTimestamp"):
                job["metadata"]["deletionTimestamp"] = now()
                self.change("MODIFIED", job)
        uid = job["metadata"]["uid"]
        threading.Timer(seconds, self._remove, (name, uid)).start()

    def _remove(self, name: str, uid: str) -> None:
        with self.lock:
            job = self.jobs.get(name)
            if job is not None and job["metadata"]["uid"] == uid:
                del self.jobs[name]
                self.change("DELETED", job)

    def state(self, name: str) -> str | None:
        job = self.jobs.get(name)
        return self.kind.state(job) if job else None

    def finished(self, name: str) -> bool:
        return self.state(name) in self.kind.terminal

    def drive(self, name: str) -> None:
        """Play the operator's part: take the watched job through the scenario's states."""
        with self.lock:
            uid = self.jobs[name]["metadata"]["uid"]
            if uid in self._driven:
                return
            self._driven.add(uid)
        threading.Thread(target=self._drive, args=(name, uid), daemon=True).start()

    def _drive(self, name: str, uid: str) -> None:
        states = self.kind.states if self.scenario.states is None else self.scenario.states
        for state in states:
            time.sleep(self.scenario.state_seconds)
            if state in self.kind.terminal:  # the job ends after its log (or 5 s, if unread)
                self.log_done.wait(5)
            with self.lock:
                job = self.jobs.get(name)
                if self.stop.is_set() or job is None or job["metadata"]["uid"] != uid:
                    return
                if state == "Deleted":
                    self.delete(name, 0)
                    return
                self.set_state(name, state)

    def next_watch(self) -> int:
        with self.lock:
            self._watches += 1
            return self._watches

    def next_log(self) -> int:
        with self.lock:
            self._logs += 1
            return self._logs

    def pods(self) -> list[dict[str, Any]]:
        """The pods of every job: its main pod and its workers or executors."""
        return [pod for name, job in list(self.jobs.items())
                for pod in self.kind.pods(name, job, self.state(name), self.scenario.sidecar,
                                          self.scenario.main_ended)]

    def log_line(self, i: int) -> tuple[datetime, str]:
        """Line ``i`` of the launcher's log and when it was written (two lines per ms)."""
        return (self.log_base + timedelta(milliseconds=i // 2), self.scenario.log_lines[i])


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


def matches(obj: dict[str, Any], selector: str) -> bool:
    """Whether ``obj`` has every ``dotted.path=value`` of a field selector."""
    for term in filter(None, selector.split(",")):
        path, _, expected = term.partition("=")
        value: Any = obj
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if str(value) != expected:
            return False
    return True


class Handler(JsonHandler):
    cluster: FakeCluster  # set on the subclass made per server
    protocol_version = "HTTP/1.1"  # streams are chunked, as the API server's and kubelet's

    def recorded(self) -> list[Request]:
        return self.cluster.requests

    def _status(self, code: int, reason: str, message: str = "") -> None:
        self._json(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                          "reason": reason, "message": message, "code": code})

    def _stream_start(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _stream_end(self) -> None:
        """A stream's proper end (a dropped one just closes the connection)."""
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _stalled(self, kind: str) -> bool:
        """Accept the request and never answer it (a partition), if the scenario says so."""
        if not self.cluster.stalls(kind):
            return False
        self.cluster.stop.wait()
        self.close_connection = True
        return True

    def _refused(self, kind: str) -> bool:
        """Answer 403, as a restarted API server does until its RBAC caches are synced."""
        if not self.cluster.forbidden(kind):
            return False
        self._status(403, "Forbidden", f'{self.cluster.kind.plural}.{self.cluster.kind.group} '
                     'is forbidden: User "system:serviceaccount:team-a:vaecf-launcher" cannot '
                     f'{kind.lower()} resource "{self.cluster.kind.plural}"')
        return True

    def _body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length)) if length else None

    def _refused_fields(self, request: Request, body: dict[str, Any]) -> bool:
        """Strict field validation, as the API server does it when asked."""
        if request.query.get("fieldValidation") != "Strict":
            return False
        kind = body.get("kind", "")
        schema = INFERENCESERVICE_SCHEMA if kind == "InferenceService" else \
            self.cluster.job_schema
        found = unknown_field(body, schema)
        if found is None:
            return False
        version = str(body.get("apiVersion", "")).rpartition("/")[2]
        self._status(400, "BadRequest", f'{kind} in version "{version}" cannot be handled as '
                     f'a {kind}: strict decoding error: unknown field "{found}"')
        return True

    def _answer(self, code: int, body: dict[str, Any]) -> None:
        """An answer to a create or patch, with the scenario's Warning headers."""
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for text in self.cluster.scenario.warnings:
            self.send_header("Warning", f'299 - "{text}"')
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = self._body() or {}
        request = self._record(body)
        if self._stalled("POST") or self._refused("POST") or \
                self._refused_fields(request, body):
            return
        name = body["metadata"]["name"]
        if request.path.endswith("/inferenceservices"):
            if name in self.cluster.services:
                return self._status(409, "AlreadyExists")
            self.cluster.services[name] = body
            return self._answer(201, body)
        with self.cluster.lock:
            if name in self.cluster.jobs:  # also while it is being deleted
                kind = self.cluster.kind
                return self._status(409, "AlreadyExists",
                                    f'{kind.plural}.{kind.group} "{name}" already exists')
            self.cluster.create(body)
        if self.cluster.scenario.on_create is not None:
            self.cluster.scenario.on_create(body)
        self._answer(201, body)

    def do_DELETE(self) -> None:
        request = self._record(self._body())
        if self._stalled("DELETE") or self._refused("DELETE"):
            return
        name = request.path.rsplit("/", 1)[-1]
        with self.cluster.lock:
            job = self.cluster.jobs.get(name)
            if job is None:
                kind = self.cluster.kind
                return self._status(404, "NotFound",
                                    f'{kind.plural}.{kind.group} "{name}" not found')
            uid = ((request.body or {}).get("preconditions") or {}).get("uid")
            if uid is not None and uid != job["metadata"]["uid"]:
                return self._status(409, "Conflict", "Precondition failed: UID in precondition")
            self.cluster.delete(name, self.cluster.scenario.deletion_seconds)
        self._json(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

    def do_GET(self) -> None:
        request = self._record()
        parts = request.path.strip("/").split("/")
        plural = self.cluster.kind.plural
        if request.path.endswith(f"/{plural}") and request.query.get("watch", "").lower() == \
                "true":
            return self._watch(request)
        kind = "log" if request.path.endswith("/log") else "GET"
        if self._stalled(kind) or self._refused(kind):
            return
        if len(parts) == 7 and parts[5] == "inferenceservices":
            service = self.cluster.services.get(parts[6])
            return self._json(200, service) if service else self._status(404, "NotFound")
        if len(parts) == 7 and parts[5] == plural:
            job = self.cluster.jobs.get(parts[6])
            return self._json(200, job) if job else self._status(404, "NotFound")
        if request.path.endswith("/pods"):
            selector = request.query.get("labelSelector", "")
            wanted = dict(term.split("=", 1) for term in filter(None, selector.split(",")))
            items = [p for p in self.cluster.pods()
                     if wanted.items() <= p["metadata"]["labels"].items()]
            return self._json(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                                    "items": items})
        if request.path.endswith("/log"):
            return self._log(parts[5], request)
        if request.path.endswith("/events"):
            selector = request.query.get("fieldSelector", "")
            items = [e for e in self.cluster.scenario.events if matches(e, selector)]
            return self._json(200, {"kind": "EventList", "apiVersion": "v1", "metadata": {},
                                    "items": items})
        self._status(404, "NotFound")

    def do_PATCH(self) -> None:
        """A JSON merge patch (RFC 7386) of an InferenceService."""
        assert self.headers["Content-Type"] == "application/merge-patch+json"
        body = self._body() or {}
        request = self._record(body)
        if self._stalled("PATCH") or self._refused_fields(request, body):
            return
        name = request.path.rsplit("/", 1)[-1]
        if name not in self.cluster.services:
            return self._status(404, "NotFound")
        self.cluster.services[name] = merge_patch(self.cluster.services[name], body)
        self._answer(200, self.cluster.services[name])

    def _watch(self, request: Request) -> None:
        cluster, scenario = self.cluster, self.cluster.scenario
        number = cluster.next_watch()
        cluster.watching.set()
        if number == scenario.restart_at_watch:  # the server goes away under this watch
            threading.Thread(target=cluster.restart, args=(scenario.down_seconds,),
                             daemon=True).start()
            self.close_connection = True
            return
        if self._stalled("watch") or self._refused("watch"):
            return
        name = request.query.get("fieldSelector", "").removeprefix("metadata.name=")
        given = request.query.get("resourceVersion")
        self._stream_start("application/json")
        if number <= len(scenario.watch_errors):
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                      **scenario.watch_errors[number - 1]}
            self._send_event("ERROR", status)
            return self._stream_end()
        if given and int(given) < cluster.watch_floor:  # older than the watch cache
            self._send_event("ERROR", {
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                "reason": "Expired", "message": f"too old resource version: {given} "
                f"({cluster.watch_floor})"})
            return self._stream_end()
        with cluster.lock:
            since = int(given) if given else cluster._rv
            current = cluster.jobs.get(name)
            if not given and current is not None:  # from now: the object as it is first
                self._send_event("ADDED", json.loads(json.dumps(current)))
        if name in cluster.jobs:
            cluster.drive(name)
        generation, ends = cluster.generation, time.monotonic() + float(
            request.query.get("timeoutSeconds", "60"))
        while (time.monotonic() < ends and not cluster.stop.is_set()
               and generation == cluster.generation):
            with cluster.lock:
                news = [(rv, kind, job) for rv, kind, job in cluster.history
                        if rv > since and job["metadata"]["name"] == name]
            for rv, kind, job in news:
                self._send_event(kind, job)
                since = rv
                if cluster.kind.state(job) == scenario.restart_at_state and \
                        not cluster.restart_begun.is_set():  # once the step has seen it
                    cluster.restart_begun.set()
                    threading.Thread(target=cluster.restart, args=(scenario.down_seconds,),
                                     daemon=True).start()
            time.sleep(0.02)
        if generation == cluster.generation:
            self._stream_end()  # else the restart cut it

    def _send_event(self, kind: str, obj: dict[str, Any]) -> None:
        self._chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

    def _log(self, pod: str, request: Request) -> None:
        cluster = self.cluster
        job = pod.removesuffix(cluster.kind.main_pod)
        containers = [cluster.kind.main_container] + (
            ["istio-proxy"] if cluster.scenario.sidecar else [])
        container = request.query.get("container")
        if container is None and len(containers) > 1:
            return self._status(400, "BadRequest", "a container name must be specified for pod "
                                f"{pod}, choose one of: [{' '.join(containers)}]")
        if container not in (None, *containers):
            return self._status(400, "BadRequest",
                                f"container {container} is not valid for pod {pod}")
        number = cluster.next_log()
        lines = cluster.scenario.log_lines
        drops = cluster.scenario.log_drops
        end = drops[number - 1] if number <= len(drops) else len(lines)
        since = request.query.get("sinceSeconds")
        oldest = (datetime.now(UTC) - timedelta(seconds=int(since)) if since
                  else cluster.log_base)
        self._stream_start("text/plain")
        for i in range(end):
            when, text = cluster.log_line(i)
            if when < oldest:
                continue
            stamp = when.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"
            prefix = f"{stamp} " if request.query.get("timestamps", "").lower() == "true" else ""
            self._chunk(f"{prefix}{text}\n".encode())
        if end < len(lines):
            return self._stream_end()  # the stream ends while the pod runs
        cluster.log_done.set()
        generation = cluster.generation
        follow = request.query.get("follow", "").lower() == "true" and \
            not cluster.scenario.main_ended  # the container ended: so does its log
        while (follow and not cluster.finished(job) and job in cluster.jobs
               and not cluster.stop.is_set() and generation == cluster.generation):
            time.sleep(0.02)  # follow: open while the launcher container runs
        self._stream_end()


class FakeApiServer:
    """Runs a ``FakeCluster`` on a free loopback port in a thread; ``restart`` takes it away
    (connections refused, open streams cut) and brings it back on the same port."""

    def __init__(self, scenario: Scenario) -> None:
        self.cluster = FakeCluster(scenario)
        self.cluster.restart = self.restart
        self._handler = type("BoundHandler", (Handler,), {"cluster": self.cluster})
        self._server = self._listen(0)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.restarts = 0

    def _listen(self, port: int) -> ThreadingHTTPServer:
        server = ThreadingHTTPServer(("127.0.0.1", port), self._handler)
        server.daemon_threads = True
        return server

    def _serve(self) -> None:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def __enter__(self) -> FakeApiServer:
        self._serve()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cluster.stop.set()
        self._server.shutdown()
        self._server.server_close()

    def restart(self, down_seconds: float) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.cluster.generation += 1
        time.sleep(down_seconds)
        self._server = self._listen(self.port)
        self.restarts += 1
        self.cluster.restarted()
        self._serve()

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


def sigterm_once_watching(server: FakeApiServer, args: list[str]) -> tuple[int, str]:
    """Run ``vaecf <args>`` in a child process, send it SIGTERM once it watches its resource (as
    the kubelet does when a KFP run is cancelled), and return its exit code and stderr."""
    process = subprocess.Popen([sys.executable, "-m", "vaecf.cli", *args], env=dict(os.environ),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.cluster.watching.wait(timeout=120), "the launcher never watched"
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    return process.returncode, err
