"""Which fields a pod template may have, from the Kubernetes API types of the installed
``kubernetes`` client (its models' ``attribute_map`` and ``openapi_types``).

The SparkApplication CRD leaves ``spec.driver.template`` and ``spec.executor.template``
unvalidated (``x-kubernetes-preserve-unknown-fields``) and the Spark Operator decodes them
into a PodTemplateSpec that drops unknown keys: a typo (``automountServiceAcountToken``)
would be stored and silently ignored. The launcher checks them before creating anything.
The models are those of the client's Kubernetes release (``kubernetes`` 30.1 is the 1.30
API): a field added to the Pod after it is refused here, named, as unknown.
"""

from __future__ import annotations

import re
from typing import Any

_LIST = re.compile(r"^list\[(.+)\]$")
_DICT = re.compile(r"^dict\(str, (.+)\)$")


def unknown_field(value: Any, model: str = "V1PodTemplateSpec", path: str = "") -> str | None:
    """The path of the first key in ``value`` that the Kubernetes type ``model`` (a client
    model's name, or ``list[...]``/``dict(str, ...)`` of one) does not declare, else None.
    Only keys are checked (the API server checks values); a value of the wrong shape is
    left to it."""
    from kubernetes import client as models

    if (inner := _LIST.match(model)) is not None:
        if not isinstance(value, list):
            return None
        return next((found for i, item in enumerate(value)
                     if (found := unknown_field(item, inner[1], f"{path}[{i}]"))), None)
    if (inner := _DICT.match(model)) is not None:
        if not isinstance(value, dict):
            return None
        return next((found for key, item in value.items()
                     if (found := unknown_field(item, inner[1], f"{path}.{key}"))), None)
    declared = getattr(models, model, None)
    if declared is None or not isinstance(value, dict):
        return None  # a scalar, a quantity, free-form ``object``
    fields = {key: attr for attr, key in declared.attribute_map.items()}
    for key, item in value.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in fields:
            return where
        if (found := unknown_field(item, declared.openapi_types[fields[key]], where)):
            return found
    return None


def client_version() -> str:
    """The installed ``kubernetes`` client's version, whose models are checked against."""
    from kubernetes import __version__

    return str(__version__)
