"""Why a job (an MPIJob, a SparkApplication) is stuck or failed: the Warning events of that job,
of the objects it owns and of its pods, and of nothing else.

Events are asked for by object (``fieldSelector`` on the involved object's uid or exact name,
and ``type=Warning``), never listed over the namespace and matched by name prefix (a job
``run-4`` would show ``run-40``'s), and shown oldest first.
"""

from __future__ import annotations

import time
from typing import Any

from vaecf.k8s import client

EVENT_PODS = 20  # pods whose events are read (a job of 1,024 workers: the first 20)


def event_time(event: Any) -> str:
    """When an event last happened, as a sortable ISO string."""
    for when in (event.last_timestamp, event.event_time, event.first_timestamp,
                 event.metadata.creation_timestamp if event.metadata else None):
        if when is not None:
            return when.isoformat() if hasattr(when, "isoformat") else str(when)
    return ""


def warnings(core: Any, ref: str, namespace: str, kind: str, name: str, uid: str | None,
             pods: str, owned: list[tuple[str, str]], timeout: float, until: float,
             limit: int = 10) -> list[str]:
    """One line per latest Warning event of the job ``kind``/``name`` (by ``uid`` when
    known), of the objects it owns (``owned``: (kind, name) pairs, e.g. an MPIJob's launcher
    Job) and of its pods (label selector ``pods``), oldest first (e.g. ``event
    Pod/<job>-worker-1: FailedScheduling: 0/4 nodes have enough nvidia.com/gpu``). Nothing is
    asked for after ``until`` (``time.monotonic()``): what was found by then is shown.

    Raises:
      ApiError: the pods or the events could not be listed.
    """

    def listed(what: str, fn: Any, **kwargs: Any) -> list[Any]:
        left = until - time.monotonic()
        if left <= 0:
            return []
        found: list[Any] = client.call(f"{ref}: {what}", fn, namespace, budget=left,
                                       timeout=timeout, **kwargs).items
        return found

    found_pods = listed("list pods", core.list_namespaced_pod, label_selector=pods)
    selectors = [f"involvedObject.uid={uid}" if uid
                 else f"involvedObject.kind={kind},involvedObject.name={name}"]
    selectors += [f"involvedObject.kind={k},involvedObject.name={n}" for k, n in owned]
    selectors += [f"involvedObject.kind=Pod,involvedObject.name={p.metadata.name}"
                  for p in found_pods[:EVENT_PODS]]
    found = [event for selector in selectors
             for event in listed("list events", core.list_namespaced_event,
                                 field_selector=f"{selector},type=Warning")]
    return [f"event {e.involved_object.kind}/{e.involved_object.name}: {e.reason}: "
            f"{e.message}" for e in sorted(found, key=event_time)[-limit:]]
