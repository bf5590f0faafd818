"""The Spark image's entrypoint (docker/spark-entrypoint.sh) with this machine's Java 17 and
PySpark: `driver` runs a vaecf stage under spark-submit as Spark on Kubernetes starts a driver
pod (a properties file, PythonRunner, the image's main file), here with a local master; and
`executor` starts Spark's Kubernetes executor backend with the pod's JVM options and memory,
which then tries the driver it was given. `make image-check` runs a driver and an executor
together in the image (docker/spark-driver-executor.sh)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from vaecf.io import read_manifest

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "docker" / "spark-entrypoint.sh"


def environment(**extra: str) -> dict[str, str]:
    """This interpreter's python3 and vaecf first on PATH (the image's are on its PATH);
    SPARK_HOME left to the entrypoint; no MASTER or SPARK_CONF_DIR from the caller."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_HOME", "MASTER", "SPARK_CONF_DIR", "PYSPARK_PYTHON")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    return {**env, **extra}


@pytest.mark.slow
def test_driver_runs_the_stage_under_spark_submit(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    code, _, err = cli("download", "--dataset", "synthetic", "--synthetic-users", "100",
                       "--synthetic-items", "40", "--output", tmp_path / "raw")
    assert code == 0, err
    properties = tmp_path / "spark.properties"
    properties.write_text("spark.master=local[1]\nspark.app.name=vaecf-entrypoint-test\n"
                          "spark.driver.host=127.0.0.1\nspark.ui.enabled=false\n"
                          "spark.sql.shuffle.partitions=4\n")
    done = subprocess.run(
        [str(ENTRYPOINT), "driver", "--properties-file", str(properties),
         "--class", "org.apache.spark.deploy.PythonRunner",
         f"local://{ROOT / 'docker' / 'spark-main.py'}", "preprocess", "--engine", "spark",
         "--input", str(tmp_path / "raw"), "--output", str(tmp_path / "spark")],
        env=environment(SPARK_DRIVER_BIND_ADDRESS="127.0.0.1"), capture_output=True, text=True,
        timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # The properties file's master, not vaecf's default (local[*]): spark-submit started it.
    assert "spark: started Spark 4.0.5, master local[1]" in done.stdout + done.stderr
    assert read_manifest(tmp_path / "spark", "preprocess")["engine"] == "spark"
    code, _, err = cli("preprocess", "--input", tmp_path / "raw", "--output",
                       tmp_path / "pandas")
    assert code == 0, err
    tables = [pq.read_table(tmp_path / e / "interactions.parquet") for e in ("spark", "pandas")]
    assert tables[0].num_rows > 0 and tables[0].equals(tables[1])


def test_executor_starts_the_kubernetes_backend_with_the_pods_settings() -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = environment(
        SPARK_DRIVER_URL=f"spark://CoarseGrainedScheduler@127.0.0.1:{port}",
        SPARK_EXECUTOR_ID="1", SPARK_EXECUTOR_CORES="1", SPARK_EXECUTOR_MEMORY="512m",
        SPARK_APPLICATION_ID="spark-test", SPARK_EXECUTOR_POD_IP="127.0.0.1",
        SPARK_RESOURCE_PROFILE_ID="0", SPARK_EXECUTOR_POD_NAME="vaecf-test-exec-1",
        SPARK_JAVA_OPT_0="-XX:+PrintCommandLineFlags")
    done = subprocess.run([str(ENTRYPOINT), "executor"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    # The JVM got the pod's option and SPARK_EXECUTOR_MEMORY as its heap (512 MiB).
    flags = done.stdout.split()
    assert "-XX:MaxHeapSize=536870912" in flags and "-XX:+PrintCommandLineFlags" in flags
    assert "KubernetesExecutorBackend: Started daemon" in done.stderr
    assert f"Failed to connect to /127.0.0.1:{port}" in done.stderr
