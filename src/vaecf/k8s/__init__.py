"""Kubernetes: render the training MPIJob from ``manifests/mpijob.yaml`` and the Spark steps'
SparkApplication from ``manifests/spark/sparkapplication.yaml``, and run them.

``render`` and ``sparkapp`` render (pure: template + parameters -> dict) so tests validate
every rendered object against its CRD schema; ``job`` runs any such job against the API server
(create, attach or replace, watch, delete) as its ``Kind`` says (``mpijob.KIND``,
``sparkapp.KIND``), ``pod_log`` follows the job's main pod's log, ``events`` explains a
stuck job and ``pod_fields`` checks pod templates no server checks, all through
``client.call`` (timeouts, retries, one-line errors) and the official ``kubernetes`` client.
"""
