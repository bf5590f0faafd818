"""Connecting to the Kubernetes API: in-cluster in a pod, else the user's kubeconfig."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vaecf.errors import VaecfError

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def api_client() -> Any:
    """An ``ApiClient``: in-cluster credentials in a pod, else ``$KUBECONFIG``/~/.kube."""
    from kubernetes import client, config

    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        # Read $KUBECONFIG now: the client reads it once, when it is first imported.
        return config.new_client_from_config(config_file=os.environ.get("KUBECONFIG"))
    except config.ConfigException as err:
        raise VaecfError(f"no Kubernetes credentials: {err}") from err


def current_namespace() -> str:
    """The pod's own namespace (where KFP runs the step), else ``default``."""
    if SERVICE_ACCOUNT_NAMESPACE.is_file():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    return "default"
