"""Run one job-like custom object (an MPIJob, a SparkApplication) to its end: create (or
attach, or replace a failed one), watch, stream its main pod's log, delete.

What differs between the kinds is a ``Kind``: its API coordinates, how its status says it has
finished, which pod's log to show and which objects' events explain it. Everything else is
one implementation: a name derived from the run id, create-or-attach (replacing a failed job,
waiting out one being deleted), following the object from one resourceVersion to the next
(watch errors, 410, a restarting API server, a stalled connection), deletion on SIGTERM or
timeout, and the marker a job deleted by someone else leaves in object storage.

Everything goes through ``vaecf.k8s.client.call`` (client-side timeouts, retries with
backoff, one-line errors) and only through the verbs the launcher's Roles grant
(``manifests/base/rbac.yaml``, ``manifests/spark/rbac.yaml``): the kind's create, get, watch
and delete, pods list, pods/log get, events list. A job this step gives up on (timeout,
cancel, lost API server) is deleted.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from vaecf import log
from vaecf.errors import VaecfError
from vaecf.io import storage
from vaecf.k8s import client, events
from vaecf.k8s.pod_log import PodLog

WATCH_CHUNK_SECONDS = 60  # the server ends each watch after this; the next resumes from it
START_BUDGET = 300.0  # seconds to reach the API server when creating (restarts take ~1 min)
DELETE_BUDGET = 20.0  # within the pod's default 30 s termination grace after SIGTERM
GONE_WAIT = 300.0  # how long a job in deletion (pods ending) may take to disappear


Outcome = tuple[str, bool, str]  # (state, succeeded, message) of a finished job


@dataclass(frozen=True)
class Kind:
    """What differs between the job kinds ``JobRun`` runs.

    Attributes:
      kind, group, version, plural: the custom resource.
      noun: how messages and ``kubectl`` name it (``mpijob``).
      outcome: ``(state, succeeded, message)`` once the object's status says it has
        finished, ``None`` before.
      role, selector: the main pod whose log is shown (``launcher``) and its label selector
        (``{name}``: the job's name).
      pods: label selector of all the job's pods (``{name}``), whose events explain it.
      owned: the (kind, name) of objects it owns whose events explain it (``{name}``).
      again: what re-creating a failed one does, for the log.
    """

    kind: str
    group: str
    version: str
    plural: str
    noun: str
    outcome: Callable[[dict[str, Any]], Outcome | None]
    role: str
    selector: str
    pods: str
    owned: tuple[tuple[str, str], ...] = ()
    again: str = "to run it again"


def job_name(run_id: str, prefix: str, limit: int) -> str:
    """A DNS-1035 label of at most ``limit`` characters derived from ``run_id``.

    The same run id always gives the same name, which is what lets a retried step attach to
    the job its first attempt created; different run ids give different names. A run id that
    is already a short lower-case slug (a KFP run id, a UUID) is kept as it is; any other
    (too long, or changed by the slugging: ``Run_42`` and ``run-42``) is cut and given the
    first 8 hex digits of its SHA-256.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-")
    if not slug:
        raise VaecfError(f"--run-id {run_id!r}: needs at least one letter or digit")
    name = f"{prefix}-{slug}"
    if len(name) > limit or slug != run_id:
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
        name = f"{name[:limit - 9].rstrip('-')}-{digest}"
    return name


class Cancelled(BaseException):
    """SIGTERM or SIGINT arrived (KFP cancels a run with SIGTERM). Not an ``Exception``, so
    no library ``except Exception`` swallows it on its way to the cleanup."""


class DeletedElsewhere(VaecfError):
    """The job was deleted by someone other than this step while the step followed it."""


@contextmanager
def delete_on_cancel(run: JobRun) -> Iterator[None]:
    """Delete ``run``'s job if this process is told to stop: a cancelled pipeline run must
    not keep holding GPUs or executors."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Cancelled(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    except Cancelled as stop:
        run.give_up(f"cancelled by {stop}")
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class JobRun:
    """One job of ``kind`` in one namespace, seen through an ``ApiClient``."""

    def __init__(self, api_client: Any, kind: Kind, namespace: str, name: str,
                 container: str, request_timeout: float = client.REQUEST_TIMEOUT) -> None:
        from kubernetes import client as k8s

        self.kind, self.namespace, self.name, self.timeout = kind, namespace, name, request_timeout
        self.uid: str | None = None  # of the job this step follows
        self._custom = k8s.CustomObjectsApi(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self.log = PodLog(self._core, namespace, self.ref, kind.role,
                          kind.selector.format(name=name), container, request_timeout)
        self._trouble = ""  # the last failure seen while watching

    @property
    def _coordinates(self) -> tuple[str, str, str, str]:
        return self.kind.group, self.kind.version, self.namespace, self.kind.plural

    @property
    def ref(self) -> str:
        return f"{self.kind.noun} {self.namespace}/{self.name}"

    def _call(self, verb: str, fn: Any, *args: Any, budget: float, **kwargs: Any) -> Any:
        return client.call(f"{self.ref}: {verb}", fn, *args, budget=budget,
                           timeout=self.timeout, **kwargs)

    def get(self, budget: float, missing_ok: bool = False) -> dict[str, Any]:
        """The job as the API server has it; ``{}`` if absent and ``missing_ok``."""
        try:
            job: dict[str, Any] = self._call("get", self._custom.get_namespaced_custom_object,
                                             *self._coordinates, self.name,
                                             budget=budget)
        except client.ApiError as err:
            if err.status == 404 and missing_ok:
                return {}
            raise
        return job

    def exists(self) -> bool:
        return bool(self.get(START_BUDGET, missing_ok=True))

    def create_or_attach(self, body: dict[str, Any]) -> bool:
        """Create the job; if it exists already (a retried step), attach to it, unless it
        failed (then it is deleted, its last events logged, and created again) or is being
        deleted (then it is waited for, and created again).

        Returns:
          True if this call created the job, False if it attached to an existing one.
        """
        for _ in range(3):
            try:
                created = client.send(f"{self.ref}: create",
                                      self._custom.create_namespaced_custom_object_with_http_info,
                                      *self._coordinates, body,
                                      budget=START_BUDGET, timeout=self.timeout)
                self.uid = created.get("metadata", {}).get("uid")
                log.info(f"created {self.ref}")
                return True
            except client.ApiError as err:
                if err.status != 409:
                    raise
            job = self.get(START_BUDGET, missing_ok=True)
            if not job:
                continue  # deleted between the two calls
            metadata = job.get("metadata", {})
            self.uid = metadata.get("uid")
            finished = self.kind.outcome(job)
            if metadata.get("deletionTimestamp"):
                log.info(f"{self.ref} is being deleted (since {metadata['deletionTimestamp']}):"
                         " waiting until it is gone to create it again")
            elif finished is not None and not finished[1]:
                log.info(f"{self.ref} exists and failed ({finished[2]}): deleting it "
                         f"{self.kind.again}")
                self.report_warnings()
                self.delete(START_BUDGET)
            else:
                log.info(f"{self.ref} already exists: attaching to it")
                return False
            self._wait_gone()
        raise VaecfError(f"{self.ref}: re-created by someone else three times while this "
                         "step tried to create it")

    def _wait_gone(self) -> None:
        give_up = time.monotonic() + GONE_WAIT
        while self.get(START_BUDGET, missing_ok=True):
            if time.monotonic() > give_up:
                raise VaecfError(f"{self.ref} is still being deleted after {GONE_WAIT:g} s; "
                                 "retry once it is gone")
            time.sleep(1.0)

    def delete(self, budget: float = DELETE_BUDGET) -> bool:
        """Delete the job this step follows and, in the foreground, its pods (frees the GPUs).
        Returns False if it was gone (or replaced by another job of that name)."""
        options: dict[str, Any] = {"propagationPolicy": "Foreground"}
        if self.uid:  # never a job of the same name that someone else created since
            options["preconditions"] = {"uid": self.uid}
        try:
            self._call("delete", self._custom.delete_namespaced_custom_object,
                       *self._coordinates, self.name, body=options, budget=budget)
        except client.ApiError as err:
            if err.status in (404, 409):
                return False
            raise
        log.info(f"deleted {self.ref}")
        return True

    def give_up(self, why: str) -> NoReturn:
        """Stop following the job, delete it (it must not hold GPUs for nobody) and raise
        ``VaecfError`` saying ``why`` and what became of the job."""
        self.log.finish(grace=0)
        try:
            self.delete()
        except client.ApiError as err:
            raise VaecfError(f"{self.ref}: {why}; could not delete it ({err}): it stops at its "
                             f"activeDeadlineSeconds, or run: kubectl delete {self.kind.noun} -n "
                             f"{self.namespace} {self.name}") from None
        raise VaecfError(f"{self.ref}: {why}; deleted the job")

    def wait(self, timeout: float) -> str:
        """Watch the job until it finishes; stream its main pod's log meanwhile.

        Returns:
          The message of a job that succeeded.

        Raises:
          DeletedElsewhere: someone else deleted the job.
          VaecfError: the job failed, or did not finish within ``timeout`` seconds, or the
            API server could not be followed (then the job is deleted).
        """
        deadline = time.monotonic() + timeout
        self.log.start()
        try:
            outcome = self._watch(deadline)
        except DeletedElsewhere:
            self.log.finish(grace=0)
            raise
        except VaecfError as err:
            self.give_up(str(err).removeprefix(f"{self.ref}: "))
        except Exception as err:  # never leave the job holding GPUs, whatever went wrong
            self.give_up(f"failed while following it ({type(err).__name__}: {err})")
        if outcome is None:
            self.report_warnings()
            trouble = f" (last trouble: {self._trouble})" if self._trouble else ""
            self.give_up(f"did not finish within {timeout:g} s{trouble}")
        return self._finish(*outcome)

    def _check(self, job: dict[str, Any]) -> Outcome | None:
        """The job's outcome if it finished; raises if it is deleted or replaced."""
        metadata = job.get("metadata", {})
        if self.uid and metadata.get("uid") not in (None, self.uid):
            raise DeletedElsewhere(f"{self.ref} was deleted and replaced by another job of "
                                   "that name while this step followed it")
        if metadata.get("deletionTimestamp"):
            raise DeletedElsewhere(f"{self.ref} is being deleted (since "
                                   f"{metadata['deletionTimestamp']}) by someone other than "
                                   "this step")
        self.uid = self.uid or metadata.get("uid")
        return self.kind.outcome(job)

    def _watch(self, deadline: float) -> Outcome | None:
        """Follow the job from one resourceVersion to the next until it finishes (its
        outcome) or ``deadline`` passes (None). Watch failures are retried with backoff."""
        from urllib3.exceptions import HTTPError

        job = self._get_followed(deadline)
        attempt = 0
        while True:
            outcome = self._check(job)
            if outcome is not None:
                return outcome
            self.log.wake()
            if (remaining := deadline - time.monotonic()) <= 0:
                return None
            pause: float | None = 0.0
            opened, quiet = time.monotonic(), True
            try:
                for kind, obj in self._events(job["metadata"]["resourceVersion"], remaining):
                    if kind == "ERROR":
                        pause = self._watch_error(obj, attempt)
                        attempt += 1
                        break
                    attempt, quiet = 0, False
                    if kind == "DELETED":
                        raise DeletedElsewhere(f"{self.ref} was deleted by someone other "
                                               "than this step while it followed the job")
                    if kind == "BOOKMARK":
                        job["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
                        continue
                    job = obj
                    if (outcome := self._check(job)) is not None:
                        return outcome
                    self.log.wake()
                else:
                    if quiet and time.monotonic() - opened < 1.0:  # closed at once: no spin
                        self._trouble = "watch: closed by the server at once"
                        pause = client.backoff(attempt)
                        attempt += 1
            except client.ApiError as err:
                if err.status == 410:  # Gone: our resourceVersion is too old; start afresh
                    pause = None
                elif not client.transient_status(err.status):
                    raise
                else:
                    self._trouble = str(err).removeprefix(f"{self.ref}: ")
                    pause = client.backoff(attempt)
                    attempt += 1
            except (HTTPError, OSError, ValueError) as err:  # dropped, stalled, garbled
                self._trouble = f"watch interrupted ({type(err).__name__})"
                pause = client.backoff(attempt)
                attempt += 1
            if pause is None:  # relist
                job = self._get_followed(deadline)
                continue
            if pause:
                log.info(f"{self.ref}: {self._trouble}; watching again in {pause:g} s")
                time.sleep(max(0.0, min(pause, deadline - time.monotonic())))

    def _watch_error(self, status: dict[str, Any], attempt: int) -> float | None:
        """What an ERROR event's Status asks for: None to relist (410), else seconds to
        wait before watching again; raises for a status retrying cannot help."""
        code = status.get("code")
        message = f"watch: HTTP {code} {status.get('reason', '')}: {status.get('message', '')}"
        if code == 410:
            return None
        if not client.transient_status(code):
            raise client.ApiError(f"{self.ref}: {message}", code)
        self._trouble = message
        hint = (status.get("details") or {}).get("retryAfterSeconds")
        return client.backoff(attempt, float(hint) if hint is not None else None)

    def _get_followed(self, deadline: float) -> dict[str, Any]:
        """The job, fetched again (at start, after a 410); absent means deleted."""
        job = self.get(max(1.0, deadline - time.monotonic()), missing_ok=True)
        if not job:
            raise DeletedElsewhere(f"{self.ref} was deleted by someone other than this step "
                                   "while it followed the job")
        return job

    def _events(self, resource_version: str, remaining: float
                ) -> Iterator[tuple[str, dict[str, Any]]]:
        """One watch request from ``resource_version``: ``(type, object)`` per event. Ends
        when the server closes it (at most ``WATCH_CHUNK_SECONDS``); it never reads past
        ``remaining`` seconds without an event (a stalled connection)."""
        chunk = min(remaining, WATCH_CHUNK_SECONDS)
        read = remaining if remaining <= WATCH_CHUNK_SECONDS else chunk + self.timeout
        response = client.call(
            f"{self.ref}: watch", self._custom.list_namespaced_custom_object,
            *self._coordinates, budget=0, timeout=(self.timeout, max(0.1, read)),
            field_selector=f"metadata.name={self.name}", resource_version=resource_version,
            allow_watch_bookmarks=True, watch=True, timeout_seconds=max(1, int(chunk)),
            _preload_content=False)
        try:
            for line in client.lines(response):
                if line.strip():
                    event = json.loads(line)
                    yield event["type"], event["object"]
        finally:  # an early return leaves the server streaming: drop the connection
            response.close()

    def report_warnings(self) -> None:
        """Log why the job is stuck or failed: its latest Warning events (never fatal)."""
        try:
            owned = [(kind, name.format(name=self.name)) for kind, name in self.kind.owned]
            for line in events.warnings(self._core, self.ref, self.namespace, self.kind.kind,
                                        self.name, self.uid,
                                        self.kind.pods.format(name=self.name), owned,
                                        self.timeout):
                log.info(line)
        except client.ApiError as err:
            log.info(f"(events unavailable: {err})")

    def _finish(self, state: str, succeeded: bool, message: str) -> str:
        self.log.finish()
        log.info(f"{self.ref} {state}" + (f" ({message})" if message else ""))
        if not succeeded:
            self.report_warnings()
            error = self.log.last_error
            where = (f"the {self.kind.role} log's last error: {error}" if error
                     else f"see the {self.kind.role} log above")
            raise VaecfError(f"{self.ref} failed: {message or 'no message'}; {where}")
        return message


def tombstone(store: str, run: JobRun) -> str:
    """Where a job deleted by someone else is recorded (``<store>/<job>/deleted/``)."""
    return f"{store.rstrip('/')}/{run.name}/deleted"


def check_published(flag: str, given: str, stage: str, made_by: str) -> None:
    """``given`` must be a complete output of the command ``made_by`` (whose manifest names
    ``stage``), checked before anything is created: on S3 its ``_SUCCESS`` marker and manifest,
    locally the manifest and the checksums it lists."""
    from vaecf.io import manifest_name, open_input, read_manifest

    if storage.is_s3(given):
        missing = {storage.SUCCESS_MARKER, manifest_name(stage)} - set(storage.list_keys(given))
        if missing:
            raise VaecfError(f"{flag} {given}: missing {', '.join(sorted(missing))} "
                             f"(not a published '{made_by}' output)")
        return
    with open_input(given) as local:
        read_manifest(local, stage)


def refuse_deleted(store: str, run: JobRun, run_id: str) -> None:
    """A job an operator deleted under an earlier attempt is never created again."""
    marker = tombstone(store, run)
    if storage.list_keys(marker):
        raise VaecfError(f"{run.ref} was deleted by someone else during an earlier attempt of "
                         f"run {run_id!r} ({marker}/): not creating it again; start a new run "
                         "(or remove that marker)")


def record_deleted(store: str, run: JobRun, run_id: str, err: DeletedElsewhere) -> VaecfError:
    """Leave the marker ``refuse_deleted`` finds; returns the step's error."""
    marker = f"{tombstone(store, run)}/{run.kind.noun}.json"
    record = {"job": run.name, "namespace": run.namespace, "run_id": run_id,
              "seen": datetime.now(UTC).isoformat(timespec="seconds"), "what": str(err)}
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "record.json"
        path.write_text(json.dumps(record, indent=1) + "\n")
        storage.upload_file(path, marker)
    return VaecfError(f"{err}; not re-creating it: {marker} keeps later attempts of this run "
                      "from doing so")


def run_to_end(run: JobRun, body: dict[str, Any], timeout: float, store: str, run_id: str,
               before_create: Callable[[], None] | None = None) -> None:
    """Create ``body`` (or attach to it, or replace it if it failed) and follow it until it
    succeeds; SIGTERM deletes it, and a deletion by someone else leaves the marker.

    Args:
      before_create: runs first unless the job exists already (a retried step attaching to
        it): e.g. staging the job's input in object storage.

    Raises:
      VaecfError: the job failed, was deleted, timed out or could not be followed.
    """
    with delete_on_cancel(run):
        if before_create is not None and not run.exists():
            before_create()
        run.create_or_attach(body)
        try:
            run.wait(timeout)
        except DeletedElsewhere as err:
            raise record_deleted(store, run, run_id, err) from None
