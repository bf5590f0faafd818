"""Kubernetes: render the training MPIJob from ``manifests/mpijob.yaml`` and run it.

``render`` is pure (template + parameters -> MPIJob dict) so tests validate every rendered job
against the CRD schema; ``mpijob`` talks to the API server (create, attach or replace, watch,
delete), ``launcher_log`` follows the launcher's log and ``events`` explains a stuck job, all
through ``client.call`` (timeouts, retries, one-line errors) and the official ``kubernetes``
client.
"""
