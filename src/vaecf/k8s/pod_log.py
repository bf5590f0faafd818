"""Follow the log of a job's main pod (an MPIJob's launcher, a Spark driver), every line
once, while the job runs, and remember its last error line.

A log stream ends while the pod runs on: the kubelet or a proxy drops it, or the container
restarts in place (the MPIJob template's ``restartPolicy: OnFailure``). So the log is followed
again until the job has finished, each time asking for the lines since the last one shown
(``sinceSeconds``, with a margin for clock skew) with their timestamps, and skipping those
already shown. A stream that keeps ending with nothing new is asked for again less and less
often (up to every ``MAX_REREAD`` s), and never again once the container has terminated (a
sidecar can keep the pod running after it). The request names the container: an injected
sidecar makes the pod's log ambiguous (HTTP 400 without it).
"""

from __future__ import annotations

import math
import re
import threading
from datetime import UTC, datetime
from typing import Any

from vaecf import log
from vaecf.k8s import client
from vaecf.threads import start_daemon

STARTED = ("Running", "Succeeded", "Failed")
SKEW_SECONDS = 300  # sinceSeconds is counted on the node's clock, not ours
IDLE_SECONDS = 300.0  # a stream silent this long is opened again (a stalled connection)
POLL_SECONDS = 5.0  # between looks for a started main pod
MAX_REREAD = 30.0  # a stream that keeps ending with nothing new is asked for again this often
FINISH_GRACE = 30.0  # after the job finished, how long its last log lines may take
# A line that says what went wrong: a vaecf stage's own error line (the best), else a Python
# exception, a traceback's start, or a log4j/logging ERROR line (Spark's JVM).
STAGE_ERROR = re.compile(r"^vaecf [a-z-]+: error: ")
ERROR_LINE = re.compile(r"^Traceback |^[A-Za-z_][\w.]*(Error|Exception)\b|\bERROR\b")


class PodLog:
    """Prints a container's log from a daemon thread (SIGTERM stays with the main thread,
    whose cancellation deletes the job).

    Args:
      ref: names the job in messages (``mpijob team-a/x``).
      role: names the pod in messages (``launcher``, ``driver``).
      selector: label selector of the job's main pod (the newest started one is followed).
      container: the container whose log is followed.
    """

    def __init__(self, core: Any, namespace: str, ref: str, role: str, selector: str,
                 container: str, timeout: float) -> None:
        self._core, self._namespace, self._ref, self.role = core, namespace, ref, role
        self._selector, self._container, self._timeout = selector, container, timeout
        self._errors = ["", ""]  # the last stage error line and the last other error line
        self._finished = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: datetime | None = None  # timestamp of the last line shown
        self._shown_at_last = 0  # lines shown with that timestamp
        self._skip = 0  # of those, how many the current stream has yet to repeat
        self._complaint = ""
        self._abandoned = False
        self._shown = 0  # lines shown

    def start(self) -> None:
        if self._thread is None:
            self._thread = start_daemon(self._follow)

    @property
    def last_error(self) -> str:
        """The last line shown that says what went wrong (a stage's error line first)."""
        return self._errors[0] or self._errors[1]

    def wake(self) -> None:
        """The job changed: look for its main pod now."""
        self._wake.set()

    def finish(self, grace: float = FINISH_GRACE) -> None:
        """The job has finished: print what is left of the log, waiting up to ``grace`` s;
        with no grace, the step has given up on the job: print nothing more."""
        self._abandoned = grace <= 0
        self._finished.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(grace)

    def _follow(self) -> None:
        done: tuple[str, int] | None = None  # (pod, restarts) whose container's log was read
        idle = 0  # streams in a row that showed nothing new
        while not self._abandoned:
            finished = self._finished.is_set()
            found = self._pod()
            pod, shown = None, self._shown
            if found is not None and found[:2] != done:
                pod = found[0]
                self._stream(pod)
                if found[2]:  # its container had ended: the log is complete (a sidecar may
                    done = found[:2]  # keep the pod running, the log won't grow)
            if finished:
                return
            idle = 0 if self._shown > shown else idle + 1
            wait = POLL_SECONDS if pod is None else min(MAX_REREAD, 2.0 ** (idle - 1))
            self._wake.wait(wait)
            self._wake.clear()

    def _pod(self) -> tuple[str, int, bool] | None:
        """The newest main pod that has started, if any: its name, its container's restarts
        and whether that container has terminated (no retry here: the loop looks again)."""
        try:
            pods = client.call(f"{self._ref}: list {self.role} pods",
                               self._core.list_namespaced_pod, self._namespace, budget=0,
                               timeout=self._timeout, label_selector=self._selector).items
        except client.ApiError as err:
            self._complain(f"({err})")
            return None
        pods.sort(key=lambda p: str(p.metadata.creation_timestamp or ""))
        started = [p for p in pods if p.status and p.status.phase in STARTED]
        if not started:
            return None
        pod = started[-1]
        for status in pod.status.container_statuses or []:
            if status.name == self._container:
                ended = status.state is not None and status.state.terminated is not None
                return pod.metadata.name, status.restart_count or 0, ended
        return pod.metadata.name, 0, False

    def _stream(self, pod: str) -> None:
        from urllib3.exceptions import HTTPError

        options: dict[str, Any] = {"container": self._container, "follow": True,
                                   "timestamps": True, "_preload_content": False}
        if self._last is not None:
            age = (datetime.now(UTC) - self._last).total_seconds()
            options["since_seconds"] = max(1, math.ceil(age)) + SKEW_SECONDS
        self._skip = self._shown_at_last
        try:
            response = client.call(f"log of pod {pod}", self._core.read_namespaced_pod_log,
                                   pod, self._namespace, budget=0,
                                   timeout=(self._timeout, IDLE_SECONDS), **options)
            for line in client.lines(response):
                self._show(line.decode("utf-8", "replace"))
        except client.ApiError as err:  # the log is a convenience, never fatal
            self._complain(f"({err})")
        except (HTTPError, OSError):  # dropped or silent too long: the loop follows again
            pass

    def _show(self, line: str) -> None:
        """Print ``line`` (``<RFC 3339 timestamp> <text>``) unless it was shown already."""
        if self._abandoned:
            return
        stamp, _, text = line.partition(" ")
        try:
            when = datetime.fromisoformat(stamp)
        except ValueError:  # no timestamp: show it
            self._print(line)
            return
        if self._last is not None and when <= self._last:
            if when < self._last:
                return
            if self._skip > 0:  # one of the lines already shown at that time
                self._skip -= 1
                return
            self._shown_at_last += 1
        else:
            self._last, self._shown_at_last, self._skip = when, 1, 0
        self._print(text)

    def _print(self, text: str) -> None:
        log.info(text)
        self._shown += 1
        if STAGE_ERROR.match(text):
            self._errors[0] = text.strip()
        elif ERROR_LINE.search(text):
            self._errors[1] = text.strip()

    def _complain(self, message: str) -> None:
        """Log a failure once, not at every retry."""
        if message != self._complaint and not self._abandoned:
            self._complaint = message
            log.info(message)
