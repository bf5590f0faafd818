"""Run one MPIJob to completion: create or attach, watch, stream the launcher log, delete.

Everything goes through the official ``kubernetes`` client, and only through the verbs the
launcher's Role grants (``manifests/base/rbac.yaml``): mpijobs create/get/list/watch/delete,
pods get/list/watch, pods/log get, events list.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from vaecf import log
from vaecf.errors import VaecfError
from vaecf.threads import start_daemon

GROUP, VERSION, PLURAL = "kubeflow.org", "v2beta1", "mpijobs"
LAUNCHER_SELECTOR = ("training.kubeflow.org/job-name={name},"
                     "training.kubeflow.org/job-role=launcher")
WATCH_CHUNK_SECONDS = 60


class Cancelled(BaseException):
    """SIGTERM or SIGINT arrived (KFP cancels a run with SIGTERM). Not an ``Exception``, so
    no library ``except Exception`` swallows it on its way to the cleanup."""


@contextmanager
def delete_on_cancel(run: MPIJobRun) -> Iterator[None]:
    """Delete ``run``'s job if this process is told to stop: a cancelled pipeline run must
    not keep holding GPUs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Cancelled(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    except Cancelled as stop:
        run.delete()
        raise VaecfError(f"{run.ref}: cancelled by {stop}; deleted the job") from None
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def terminal_condition(job: dict[str, Any]) -> tuple[str, str] | None:
    """``("Succeeded"|"Failed", message)`` once the job has finished, else ``None``."""
    for condition in job.get("status", {}).get("conditions") or []:
        if condition.get("type") in ("Succeeded", "Failed") and condition.get("status") == "True":
            reason = condition.get("reason") or ""
            message = condition.get("message") or ""
            return condition["type"], f"{reason}: {message}".strip(": ")
    return None


class MPIJobRun:
    """One MPIJob in one namespace, seen through an ``ApiClient``."""

    def __init__(self, api_client: Any, namespace: str, name: str) -> None:
        from kubernetes import client

        self.namespace = namespace
        self.name = name
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self._streamed: set[str] = set()
        self._log_thread: threading.Thread | None = None

    @property
    def ref(self) -> str:
        return f"mpijob {self.namespace}/{self.name}"

    def exists(self) -> bool:
        return bool(self._get(missing_ok=True))

    def _get(self, missing_ok: bool = False) -> dict[str, Any]:
        """The job as the API server has it; ``{}`` if absent and ``missing_ok``."""
        from kubernetes.client.exceptions import ApiException

        try:
            job: dict[str, Any] = self._custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name)
        except ApiException as err:
            if err.status == 404 and missing_ok:
                return {}
            raise VaecfError(f"{self.ref}: get failed: HTTP {err.status} {err.reason}") from err
        return job

    def create_or_attach(self, body: dict[str, Any]) -> bool:
        """Create the job; if it exists already (a retried step), attach to it.

        Returns:
          True if this call created the job, False if it attached to an existing one.
        """
        from kubernetes.client.exceptions import ApiException

        try:
            self._custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                         PLURAL, body)
        except ApiException as err:
            if err.status != 409:
                raise VaecfError(f"{self.ref}: create failed: HTTP {err.status} "
                                 f"{err.reason}") from err
            log.info(f"{self.ref} already exists: attaching to it")
            return False
        log.info(f"created {self.ref}")
        return True

    def delete(self) -> None:
        """Delete the job and, in the foreground, its pods (frees the GPUs)."""
        from kubernetes.client.exceptions import ApiException

        try:
            self._custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name,
                propagation_policy="Foreground")
            log.info(f"deleted {self.ref}")
        except ApiException as err:
            if err.status != 404:
                raise VaecfError(f"{self.ref}: delete failed: HTTP {err.status}") from err

    def wait(self, timeout: float) -> str:
        """Watch the job until it finishes; stream the launcher's log meanwhile.

        Returns:
          The terminal condition's message of a Succeeded job.

        Raises:
          VaecfError: the job failed, or did not finish within ``timeout`` seconds (then
            it is deleted so it stops holding GPUs).
        """
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import ProtocolError

        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            stream = watch.Watch().stream(
                self._custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace,
                PLURAL, field_selector=f"metadata.name={self.name}",
                timeout_seconds=max(1, int(min(remaining, WATCH_CHUNK_SECONDS))))
            try:
                for event in stream:
                    finished = terminal_condition(event["object"])
                    self._follow_launcher_log()
                    if finished is not None:
                        return self._finish(*finished)
            except ProtocolError as err:  # a dropped connection: watch again
                log.info(f"{self.ref}: watch interrupted ({err}); watching again")
            except ApiException as err:
                if err.status != 410:  # 410 Gone: resource version too old, watch again
                    raise VaecfError(f"{self.ref}: watch failed: HTTP {err.status} "
                                     f"{err.reason}") from err
            if (finished := terminal_condition(self._get())) is not None:
                return self._finish(*finished)
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        self.report_warnings()
        self.delete()
        raise VaecfError(f"{self.ref} did not finish within {timeout:g} s (deleted it)")

    def report_warnings(self, limit: int = 10) -> None:
        """Log the job's and its pods' latest Warning events: why a job is stuck or failed
        (e.g. ``FailedScheduling: 0/4 nodes have enough nvidia.com/gpu``)."""
        from kubernetes.client.exceptions import ApiException

        try:
            events = self._core.list_namespaced_event(self.namespace).items
        except ApiException as err:  # diagnostics only, never fatal
            log.info(f"(events of {self.ref} unavailable: HTTP {err.status})")
            return
        mine = [e for e in events if e.type == "Warning" and e.involved_object
                and (e.involved_object.name or "").startswith(self.name)]
        for event in mine[-limit:]:
            log.info(f"event {event.involved_object.kind}/{event.involved_object.name}: "
                     f"{event.reason}: {event.message}")

    def _finish(self, state: str, message: str) -> str:
        self._follow_launcher_log(wait=True)
        log.info(f"{self.ref} {state}" + (f" ({message})" if message else ""))
        if state != "Succeeded":
            self.report_warnings()
            raise VaecfError(f"{self.ref} failed: {message or 'no message'}; see the "
                             "launcher log above")
        return message

    def _follow_launcher_log(self, wait: bool = False) -> None:
        """Stream each launcher pod's log once; with ``wait``, to its end, in this thread."""
        if self._log_thread is not None and self._log_thread.is_alive():
            if wait:
                self._log_thread.join()
            return
        pods = self._core.list_namespaced_pod(
            self.namespace, label_selector=LAUNCHER_SELECTOR.format(name=self.name)).items
        ready = [p.metadata.name for p in pods
                 if p.status and p.status.phase in ("Running", "Succeeded", "Failed")
                 and p.metadata.name not in self._streamed]
        if not ready:
            return
        self._streamed.add(ready[0])
        # SIGTERM must reach the main thread's watch: the cancellation deletes the job
        self._log_thread = start_daemon(self._stream_log, ready[0])
        if wait:
            self._log_thread.join()

    def _stream_log(self, pod: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            response = self._core.read_namespaced_pod_log(
                pod, self.namespace, follow=True, _preload_content=False)
            pending = b""
            for chunk in response.stream(4096):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    log.info(line.decode("utf-8", "replace"))
            if pending:
                log.info(pending.decode("utf-8", "replace"))
        except (ApiException, OSError) as err:  # the log is a convenience, never fatal
            log.info(f"(log of pod {pod} unavailable: {err})")
