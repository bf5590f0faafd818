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
and delete, pods list, pods/log get, events list. ``--timeout`` is a deadline for all of it.
A job this step gives up on (deadline, cancel, a refusal of a call never granted) is deleted;
one the API server itself keeps the step from following (unreachable or failing beyond the
retries, refusing what it granted before) is left running for a retry of the step.

SIGTERM and SIGINT are recorded by their handler and acted on by this module's own code
(``CancelRequest``), never raised from the handler into the kubernetes client or urllib3.
"""

from __future__ import annotations

import hashlib
import json
import math
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
QUICK_WATCH = 1.0  # a watch that ends sooner than this is followed by a backoff (no spin)
START_BUDGET = 300.0  # seconds to reach the API server when creating (restarts take ~1 min)
# After the deadline or SIGTERM, the diagnostics and the delete share this long: the step ends
# within --timeout + CLEANUP_SECONDS, and within the pod's default 30 s termination grace.
CLEANUP_SECONDS = 20.0
CLEANUP_REQUEST = 5.0  # each cleanup request's own limit: a frozen connection leaves retries
GONE_WAIT = 300.0  # how long a job in deletion (pods ending) may take to disappear
TICK = 0.1  # a pause of a step being cancelled ends within this (no handler can wake a sleep)


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
      thing: what messages call one (``job``, ``application``).
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
    thing: str = "job"


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
    """SIGTERM or SIGINT arrived (KFP cancels a run with SIGTERM), raised by ``CancelRequest``
    between calls. Not an ``Exception``, so no ``except Exception`` swallows it on its way to
    the cleanup."""


class CancelRequest:
    """SIGTERM or SIGINT, recorded by the signal handler and acted on by the step's own code.

    The handler raises nothing. An exception raised from a handler lands at whatever bytecode
    the main thread has reached, which can be just after a library took a lock and before the
    ``with`` block that releases it (urllib3's connection pool, a ``threading.Event``: CPython
    runs handlers between the two); the cleanup then waits on that lock for ever. So the
    handler records the first signal and cuts the API client's connections (``cut``, from
    ``client.connection_cutter``): the watch and any request waiting for its answer return at
    once. ``check`` raises ``Cancelled`` before each call and between watch events, and a
    pause between retries ends within ``TICK``. Later signals change nothing: the cleanup that
    follows is bounded (``CLEANUP_SECONDS``).
    """

    def __init__(self, cut: Callable[[], None]) -> None:
        self.signal_name = ""  # the first signal's name (``"SIGTERM"``), once one arrived
        self._raised = False
        self._cut = cut

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: runs in the main thread, wherever it was, maybe with a lock
        held. It records the signal and shuts sockets down (system calls), nothing more."""
        if not self.signal_name:
            self.signal_name = signal.Signals(signum).name
            self._cut()

    @property
    def pending(self) -> bool:
        """A signal arrived that ``check`` has not raised yet."""
        return bool(self.signal_name) and not self._raised

    def check(self) -> None:
        """Raise ``Cancelled`` if a signal arrived; once: the cleanup that follows goes on."""
        if self.pending:
            self._raised = True
            raise Cancelled(self.signal_name)

    def sleep(self, seconds: float) -> None:
        """``time.sleep(seconds)``, ended by a signal within ``TICK`` (then ``check``)."""
        until = time.monotonic() + seconds
        while not self.pending and (left := until - time.monotonic()) > 0:
            time.sleep(min(TICK, left))
        self.check()


class DeletedElsewhere(VaecfError):
    """The job was deleted by someone other than this step while the step followed it."""


class OutOfTime(VaecfError):
    """The step's deadline passed while it waited for the API server."""


class RefusedAgain(VaecfError):
    """The API server kept refusing (401/403) a call it had granted earlier in this step,
    past ``client.REFUSAL_GRACE``: its own trouble, never a reason to delete the job."""


@contextmanager
def delete_on_cancel(run: JobRun) -> Iterator[None]:
    """Delete ``run``'s job if this process is told to stop: a cancelled pipeline run must
    not keep holding GPUs or executors. The signal is recorded by ``run.cancel`` and raised
    as ``Cancelled`` by the run's own code (at the latest here, on the way out)."""
    handler = run.cancel.handle
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
        run.cancel.check()
    except Cancelled as stop:
        run.give_up(f"cancelled by {stop}")
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class JobRun:
    """One job of ``kind`` in one namespace, seen through an ``ApiClient``.

    ``deadline`` (``time.monotonic()``; set by ``run_to_end`` from ``--timeout``) bounds every
    call: no request, retry or watch read waits past it. After it (or SIGTERM) the diagnostics
    and the delete get ``CLEANUP_SECONDS`` more."""

    def __init__(self, api_client: Any, kind: Kind, namespace: str, name: str,
                 container: str, request_timeout: float = client.REQUEST_TIMEOUT) -> None:
        from kubernetes import client as k8s

        self.kind, self.namespace, self.name, self.timeout = kind, namespace, name, request_timeout
        self.uid: str | None = None  # of the job this step follows
        self.deadline = math.inf
        self._custom = k8s.CustomObjectsApi(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self.log = PodLog(self._core, namespace, self.ref, kind.role,
                          kind.selector.format(name=name), container, request_timeout)
        self._trouble = ""  # the last failure seen while watching
        self._granted: set[str] = set()  # the verbs the API server answered in this step
        self._refused_since: float | None = None  # the watch's first 401/403 in a row
        self._sent_create = False  # the job may exist because of this step
        self._cleaning = False
        self.cancel = CancelRequest(client.connection_cutter(api_client))

    @property
    def _coordinates(self) -> tuple[str, str, str, str]:
        return self.kind.group, self.kind.version, self.namespace, self.kind.plural

    @property
    def ref(self) -> str:
        return f"{self.kind.noun} {self.namespace}/{self.name}"

    def left(self) -> float:
        """Seconds until the deadline."""
        return self.deadline - time.monotonic()

    def _request_limit(self) -> float:
        return min(self.timeout, CLEANUP_REQUEST) if self._cleaning else self.timeout

    def _call(self, verb: str, fn: Any, *args: Any, budget: float, send: bool = False,
              **kwargs: Any) -> Any:
        """``client.call`` (``client.send`` for a create) within ``budget`` and the deadline;
        a verb answered before may be refused for a moment (a restarting API server)."""
        self.cancel.check()
        left = self.left()
        if left <= 0:
            raise OutOfTime(f"{self.ref}: {verb}: the deadline passed")
        timeout = self._request_limit()
        through = client.send if send else client.call
        try:
            answer = through(f"{self.ref}: {verb}", fn, *args, budget=min(budget, left),
                             timeout=timeout, granted=verb in self._granted,
                             sleep=self.cancel.sleep, **kwargs)
        except client.ApiError as err:
            if client.transient_status(err.status) and left <= budget:  # the deadline's
                raise OutOfTime(str(err)) from None
            if verb in self._granted and err.status in client.REFUSED_STATUS:
                raise RefusedAgain(f"{err}, for {client.REFUSAL_GRACE:g} s after it was "
                                   "granted") from None
            raise
        self._granted.add(verb)
        return answer

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
                self._sent_create = True
                created = self._call(
                    "create", self._custom.create_namespaced_custom_object_with_http_info,
                    *self._coordinates, body, budget=START_BUDGET, send=True)
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
                self.report_warnings(self.deadline)
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
            self.cancel.sleep(min(1.0, max(0.0, self.left())))

    def delete(self, budget: float = CLEANUP_SECONDS) -> bool:
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

    def _clean_up(self) -> None:
        """From now on, calls get ``CLEANUP_SECONDS`` in all (short requests, retried)."""
        if not self._cleaning:
            self._cleaning = True
            self.deadline = time.monotonic() + CLEANUP_SECONDS

    def give_up(self, why: str, warnings: bool = False) -> NoReturn:
        """Stop following the job, delete it (it must not hold GPUs for nobody) and raise
        ``VaecfError`` saying ``why`` and what became of the job; with ``warnings``, its
        Warning events are logged first (within half the cleanup time)."""
        self.log.finish(grace=0)
        self._clean_up()
        thing = self.kind.thing
        if self.uid is None and not self._sent_create:
            raise VaecfError(f"{self.ref}: {why}; nothing was created")
        if warnings:
            self.report_warnings(time.monotonic() + CLEANUP_SECONDS / 2)
        try:
            self.delete()
        except (client.ApiError, OutOfTime, RefusedAgain) as err:
            raise VaecfError(f"{self.ref}: {why}; could not delete the {thing} ({err}): it "
                             f"stops at its activeDeadlineSeconds, or run: kubectl delete "
                             f"{self.kind.noun} -n {self.namespace} {self.name}") from None
        raise VaecfError(f"{self.ref}: {why}; deleted the {thing}")

    def leave_running(self, why: str) -> NoReturn:
        """Stop following a job the API server keeps from being followed, and leave it be: a
        step never deletes a healthy job because of the API server's own trouble."""
        self.log.finish(grace=0)
        raise VaecfError(f"{self.ref}: {why}; left the {self.kind.thing} running (a retry of "
                         "this step attaches to it; it stops at its activeDeadlineSeconds)")

    def time_out(self, timeout: float, trouble: str = "") -> NoReturn:
        """The deadline passed: give up on the job, saying what went wrong on the way."""
        trouble = trouble or self._trouble
        trouble = f" (last trouble: {trouble})" if trouble else ""
        self.give_up(f"did not finish within {timeout:g} s{trouble}", warnings=True)

    def wait(self, timeout: float) -> str:
        """Watch the job until it finishes or the deadline passes; stream its main pod's
        log meanwhile.

        Returns:
          The message of a job that succeeded.

        Raises:
          DeletedElsewhere: someone else deleted the job.
          VaecfError: the job failed, or did not finish by the deadline (``timeout``
            seconds after the step started), or could not be followed (then the job is
            deleted, unless the API server itself failed: unreachable or erring beyond the
            retries, or refusing what it had granted before).
        """
        self.log.start()
        try:
            outcome = self._watch()
        except DeletedElsewhere:
            self.log.finish(grace=0)
            raise
        except OutOfTime as err:
            self.time_out(timeout, str(err).removeprefix(f"{self.ref}: "))
        except RefusedAgain as err:
            self.leave_running(str(err).removeprefix(f"{self.ref}: "))
        except client.ApiError as err:
            if client.transient_status(err.status):  # unreachable or failing: not the job's
                self.leave_running(str(err).removeprefix(f"{self.ref}: "))
            self.give_up(str(err).removeprefix(f"{self.ref}: "))
        except VaecfError as err:
            self.give_up(str(err).removeprefix(f"{self.ref}: "))
        except Exception as err:  # never leave the job holding GPUs, whatever went wrong
            self.give_up(f"failed while following it ({type(err).__name__}: {err})")
        if outcome is None:
            self.time_out(timeout)
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

    def _watch(self) -> Outcome | None:
        """Follow the job from one resourceVersion to the next until it finishes (its
        outcome) or the deadline passes (None).

        A watch that fails, or ends within ``QUICK_WATCH``, is followed by a backoff (1, 2,
        4... 30 s), so nothing repeats faster than once a second. After 410 Gone (the
        resourceVersion is older than the API server's watch cache, e.g. after its restart)
        the next watch asks for no resourceVersion: the server sends the job as it is now and
        then its changes, and the watch after that resumes from the newest resourceVersion a
        change or bookmark carried (never the job's own, which is what expired)."""
        from urllib3.exceptions import HTTPError

        job = self._get_followed()
        resume: str | None = job["metadata"]["resourceVersion"]
        attempt = 0
        self.log.wake()
        while True:
            if (outcome := self._check(job)) is not None:
                return outcome
            if self.left() <= 0:
                return None
            opened, hint = time.monotonic(), None
            trouble = ""
            try:
                for kind, obj in self._events(resume):
                    if kind == "ERROR":
                        resume, hint, trouble = self._watch_error(obj, resume)
                        break
                    self._granted.add("watch")  # an event, not just an open stream
                    self._refused_since = None
                    if kind == "DELETED":
                        raise DeletedElsewhere(f"{self.ref} was deleted by someone other "
                                               "than this step while it followed the job")
                    if kind != "ADDED" or resume is not None:  # ADDED: as it was, not new
                        resume = obj["metadata"]["resourceVersion"]
                    if kind == "BOOKMARK":
                        continue
                    job = obj
                    if (outcome := self._check(job)) is not None:
                        return outcome
                    self.log.wake()
            except client.ApiError as err:  # no answer, or a refusal, opening the watch
                if err.status == 410:
                    resume = None
                    trouble = str(err).removeprefix(f"{self.ref}: ") + " (watching from now)"
                else:
                    trouble = self._refusal(err)
            except (HTTPError, OSError, ValueError) as err:  # dropped, stalled, garbled
                if self.left() > 0.1:  # a quiet job's stream read up to the deadline: fine
                    trouble = f"watch interrupted ({type(err).__name__})"
            self.cancel.check()  # the handler cut the stream
            if not trouble and time.monotonic() - opened >= QUICK_WATCH:
                attempt = 0
                continue
            if not trouble and self.left() > 0.1:
                trouble = f"watch: closed by the server within {QUICK_WATCH:g} s"
            pause = client.backoff(attempt, hint)
            attempt += 1
            if trouble:
                self._trouble = trouble
                log.info(f"{self.ref}: {trouble}; watching again in {pause:g} s")
            self.cancel.sleep(max(0.0, min(pause, self.left())))

    def _refusal(self, err: client.ApiError) -> str:
        """What a failed watch request means: trouble to retry, or raised if final. A 401/403
        of a watch granted before is retried for ``client.REFUSAL_GRACE`` seconds."""
        status, line = err.status, str(err).removeprefix(f"{self.ref}: ")
        if client.transient_status(status):
            return line
        if status in client.REFUSED_STATUS and "watch" in self._granted:
            now = time.monotonic()
            self._refused_since = self._refused_since or now
            if now - self._refused_since < client.REFUSAL_GRACE:
                return line
            raise RefusedAgain(f"{line}, for {client.REFUSAL_GRACE:g} s after it was granted")
        raise err

    def _watch_error(self, status: dict[str, Any], resume: str | None
                     ) -> tuple[str | None, float | None, str]:
        """What an ERROR event's Status asks for: ``(resourceVersion to resume from, the
        server's retry hint, the trouble)``; raises for a status retrying cannot help."""
        code = status.get("code")
        message = f"watch: HTTP {code} {status.get('reason', '')}: {status.get('message', '')}"
        if code == 410:  # Gone: our resourceVersion is too old; watch from now
            return None, None, f"{message} (watching from now)"
        hint = (status.get("details") or {}).get("retryAfterSeconds")
        self._refusal(client.ApiError(f"{self.ref}: {message}", code))
        return resume, float(hint) if hint is not None else None, message

    def _get_followed(self) -> dict[str, Any]:
        """The job, fetched at start; absent means deleted."""
        job = self.get(START_BUDGET, missing_ok=True)
        if not job:
            raise DeletedElsewhere(f"{self.ref} was deleted by someone other than this step "
                                   "while it followed the job")
        return job

    def _events(self, resource_version: str | None) -> Iterator[tuple[str, dict[str, Any]]]:
        """One watch request from ``resource_version`` (None: from now, the job as it is
        first): ``(type, object)`` per event. Ends when the server closes it (at most
        ``WATCH_CHUNK_SECONDS``) and never reads past the deadline (a stalled connection)."""
        remaining = self.left()
        if remaining <= 0:
            return
        chunk = min(remaining, WATCH_CHUNK_SECONDS)
        read = remaining if remaining <= WATCH_CHUNK_SECONDS else chunk + self.timeout
        since: dict[str, Any] = ({} if resource_version is None
                                 else {"resource_version": resource_version})
        self.cancel.check()
        response = client.call(
            f"{self.ref}: watch", self._custom.list_namespaced_custom_object,
            *self._coordinates, budget=0,
            timeout=(max(client.MIN_WAIT, min(self.timeout, remaining)), max(0.1, read)),
            field_selector=f"metadata.name={self.name}", allow_watch_bookmarks=True,
            watch=True, timeout_seconds=max(1, int(chunk)), _preload_content=False, **since)
        try:
            self.cancel.check()  # a signal while it was opened: on a connection not cut
            for line in client.lines(response):
                if line.strip():
                    event = json.loads(line)
                    yield event["type"], event["object"]
                    self.cancel.check()
        finally:  # an early return leaves the server streaming: drop the connection
            response.close()

    def report_warnings(self, until: float) -> None:
        """Log why the job is stuck or failed: its latest Warning events (never fatal),
        asked for until ``until`` (``time.monotonic()``) at the latest."""
        try:
            owned = [(kind, name.format(name=self.name)) for kind, name in self.kind.owned]
            for line in events.warnings(self._core, self.ref, self.namespace, self.kind.kind,
                                        self.name, self.uid,
                                        self.kind.pods.format(name=self.name), owned,
                                        self._request_limit(), until):
                log.info(line)
        except client.ApiError as err:
            log.info(f"(events unavailable: {err})")

    def _finish(self, state: str, succeeded: bool, message: str) -> str:
        self.log.finish()
        log.info(f"{self.ref} {state}" + (f" ({message})" if message else ""))
        if not succeeded:
            self.report_warnings(max(self.deadline, time.monotonic() + CLEANUP_SECONDS / 2))
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


def stage(local: Path, uri: str) -> Callable[[], None]:
    """Publish the job's input ``local`` at ``uri``; returns what removes it again (the
    marker first, then exactly the objects uploaded)."""
    log.info(f"staging the input at {uri}")
    storage.upload_dir(local, uri)
    uploaded = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())

    def remove() -> None:
        storage.delete_keys(uri, [storage.SUCCESS_MARKER])
        storage.delete_keys(uri, uploaded)
        log.info(f"removed the staged input at {uri}")

    return remove


def run_to_end(run: JobRun, body: dict[str, Any], timeout: float, store: str, run_id: str,
               staged: tuple[Path, str] | None = None) -> None:
    """Create ``body`` (or attach to it, or replace it if it failed) and follow it until it
    succeeds, all within ``timeout`` seconds of Kubernetes calls (staging the input is not
    counted; then the job is deleted, within ``CLEANUP_SECONDS`` more); SIGTERM deletes it,
    and a deletion by someone else leaves the marker.

    Args:
      staged: (a local directory, an s3:// URI): the job's input, published there first
        unless the job exists already (a retried step attaching to it), and removed again if
        the API server refuses the job.

    Raises:
      VaecfError: the job failed, was deleted, timed out or could not be followed.
    """
    run.deadline = time.monotonic() + timeout
    with delete_on_cancel(run):
        try:
            remove = None
            if staged is not None and not run.exists():
                began = time.monotonic()
                remove = stage(*staged)
                run.deadline += time.monotonic() - began  # object storage's time, not the job's
                run.cancel.check()
            try:
                run.create_or_attach(body)
            except client.ApiError as err:
                if remove is not None and not client.transient_status(err.status):
                    remove()  # refused: the job will never read it
                raise
        except OutOfTime as err:
            run.time_out(timeout, str(err).removeprefix(f"{run.ref}: "))
        try:
            run.wait(timeout)
        except DeletedElsewhere as err:
            raise record_deleted(store, run, run_id, err) from None
