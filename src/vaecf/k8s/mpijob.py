"""The MPIJob (kubeflow.org/v2beta1) as a job ``vaecf.k8s.job`` runs: how its conditions say
it has finished, its launcher pod (whose log is shown) and what explains it (its launcher Job
and its pods' events).
"""

from __future__ import annotations

from typing import Any

from vaecf.k8s import job

JOB_NAME_LABEL = "training.kubeflow.org/job-name"
ROLE_LABEL = "training.kubeflow.org/job-role"


def terminal_condition(mpijob: dict[str, Any]) -> job.Outcome | None:
    """``("Succeeded"|"Failed", succeeded, message)`` once the job has finished, else None."""
    for condition in mpijob.get("status", {}).get("conditions") or []:
        if condition.get("type") in ("Succeeded", "Failed") and condition.get("status") == "True":
            reason = condition.get("reason") or ""
            message = condition.get("message") or ""
            return (condition["type"], condition["type"] == "Succeeded",
                    f"{reason}: {message}".strip(": "))
    return None


KIND = job.Kind(kind="MPIJob", group="kubeflow.org", version="v2beta1", plural="mpijobs",
                noun="mpijob", outcome=terminal_condition, role="launcher",
                selector=f"{JOB_NAME_LABEL}={{name}},{ROLE_LABEL}=launcher",
                pods=f"{JOB_NAME_LABEL}={{name}}", owned=(("Job", "{name}-launcher"),),
                again="to train again (from its newest checkpoint)")
