"""Kubernetes: render the training MPIJob from ``manifests/mpijob.yaml`` and run it.

``render`` is pure (template + parameters -> MPIJob dict) so tests validate every rendered job
against the CRD schema; ``mpijob`` talks to the API server (create or attach, watch, logs,
delete) through the official ``kubernetes`` client.
"""
