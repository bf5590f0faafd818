"""``--engine spark`` on a Spark standalone cluster with no shared disk: a master and two
workers, each worker (and so each executor it starts) in its own mount namespace where a
tmpfs hides ``/tmp`` and the driver's temporary folder (the interpreter and the package, which
lie in ``/tmp`` in CI's clone, are bound back). With ``s3://`` input and output (S3 on
moto's server) the stages run and equal the pandas engine's; a driver-local input is opened
by no executor (the stage fails), which is what makes the first test a proof.

Root is needed for ``unshare --mount`` (CI runs as root); the cluster is one module fixture
(three JVMs), each stage one driver process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_spark_engine import assert_same_split
from test_spark_object_storage import _parts_table

import vaecf.data.spark
from vaecf.data.preprocess import INTERACTIONS
from vaecf.data.splits import PART_FILES
from vaecf.io import read_manifest
from vaecf.io.storage import download_dir
from vaecf.serve.loadtest import free_port

# three JVMs of the cluster and one per driver on 2 cores: minutes, more on a loaded machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None
                                 or shutil.which("java") is None,
                                 reason="needs root, unshare and Java 17 (CI has them)")]
_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1"}


def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def _private_tmp(hidden: Path) -> str:
    """The ``sh -c`` script that starts a worker with a tmpfs over the drivers' folder and
    over ``/tmp``, and that execs its arguments. What the worker must run lies maybe in
    ``/tmp`` (CI's clone, its virtual environment): those folders are bound back from the old
    ``/tmp``, reached through a descriptor held open across the mount (``--no-canonicalize``:
    else ``mount`` resolves the link to the new, empty ``/tmp``)."""
    import vaecf

    tmp = Path("/tmp").resolve()
    needed = sorted({Path(sys.prefix).resolve(), Path(vaecf.__file__).resolve().parents[1]})
    kept = [path for path in needed if path.is_relative_to(tmp)
            and not any(path != other and path.is_relative_to(other) for other in needed)]
    back = "".join(f" && mkdir -p '{path}' && mount --no-canonicalize --bind "
                   f"\"/proc/$$/fd/3/{path.relative_to(tmp)}\" '{path}'" for path in kept)
    # the drivers' folder first: it may lie in /tmp, which hides it too
    return (f"exec 3</tmp && mount -t tmpfs tmpfs '{hidden}' && mount -t tmpfs tmpfs /tmp{back}"
            " && exec \"$0\" \"$@\" 3<&-")


def _alive_workers(ui: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as answer:
            return int(json.load(answer).get("aliveworkers", 0))
    except OSError:
        return 0


@pytest.fixture(scope="module")
def cluster(s3_server: str, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[dict[str, str]]:
    """A standalone master and two one-core workers, each in a mount namespace of its own
    with a tmpfs over ``/tmp`` and over the drivers' temporary folder; yields the drivers'
    environment (``MASTER``, ``TMPDIR``, ``SPARK_CONF_DIR``, S3)."""
    root = tmp_path_factory.mktemp("cluster")
    hidden = root / "driver-tmp"  # the drivers' $TMPDIR: their staging, Spark's local dirs
    hidden.mkdir()
    conf = root / "conf"
    conf.mkdir()
    shutil.copy(Path(vaecf.data.spark.__file__).with_name("log4j2.properties"), conf)
    port, ui = free_port(), free_port()
    (conf / "spark-defaults.conf").write_text("\n".join([
        "spark.driver.host 127.0.0.1", "spark.driver.bindAddress 127.0.0.1",
        "spark.ui.enabled false", "spark.executor.memory 512m", "spark.executor.cores 1",
        "spark.cores.max 2", "spark.sql.shuffle.partitions 4",
        # the two workers share a host name but not a disk: each reads the other's shuffle
        # files through it, not from a disk it cannot see (Spark's same-host shortcut)
        "spark.shuffle.readHostLocalDisk false",
        "spark.executor.extraJavaOptions -XX:TieredStopAtLevel=1 -XX:+UseSerialGC", ""]))
    env = {**os.environ, **_CREDENTIALS, "AWS_ENDPOINT_URL": s3_server,
           "SPARK_CONF_DIR": str(conf), "PYSPARK_PYTHON": sys.executable}
    log = open(root / "cluster.log", "ab")  # noqa: SIM115 (held open while the JVMs run)
    started = [subprocess.Popen(
        [_spark_class(), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
         "--port", str(port), "--webui-port", str(ui)],
        env=env, stdout=log, stderr=log, start_new_session=True)]
    hide = _private_tmp(hidden)
    for _ in range(2):
        started.append(subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", hide,
             _spark_class(), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
             "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
             "--work-dir", "/tmp/work", f"spark://127.0.0.1:{port}"],
            env=env, stdout=log, stderr=log, start_new_session=True))
    try:
        deadline = time.monotonic() + 240
        while _alive_workers(ui) < 2:
            if time.monotonic() > deadline or any(p.poll() is not None for p in started):
                pytest.fail("the standalone cluster did not start: "
                            + (root / "cluster.log").read_text()[-2000:])
            time.sleep(1)
        yield {**env, "MASTER": f"spark://127.0.0.1:{port}", "TMPDIR": str(hidden)}
    finally:
        for process in reversed(started):
            if process.poll() is None:
                os.killpg(process.pid, 15)
        for process in reversed(started):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait()
        log.close()


def _vaecf(env: dict[str, str], *argv: object) -> subprocess.CompletedProcess[str]:
    """``vaecf <argv>`` as its own driver process on the cluster."""
    return subprocess.run([sys.executable, "-m", "vaecf.cli", *map(str, argv)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def _said(done: subprocess.CompletedProcess[str]) -> str:
    """A failed driver's own lines and its tasks' Python errors, not the JVM's stack."""
    lines = (done.stdout + done.stderr).splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("at "))[-6000:]


@pytest.fixture(scope="module")
def published(cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[dict[str, str]]:
    """A synthetic download at ``s3://vaecf-cluster/raw`` and its Spark preprocess on the
    cluster (``preprocess``: its output, ``done``: the driver's output lines)."""
    import boto3

    from vaecf.cli import main

    with pytest.MonkeyPatch.context() as patch:
        for name in (*_CREDENTIALS, "AWS_ENDPOINT_URL"):
            patch.setenv(name, cluster[name])
        boto3.client("s3").create_bucket(Bucket="vaecf-cluster")
        raw, interactions = "s3://vaecf-cluster/raw", "s3://vaecf-cluster/interactions"
        assert main(["download", "--dataset", "synthetic", "--synthetic-users", "240",
                     "--synthetic-items", "90", "--output", raw]) == 0
        done = _vaecf(cluster, "preprocess", "--input", raw, "--output", interactions,
                      "--engine", "spark")
        assert done.returncode == 0, _said(done)
        yield {"raw": raw, "preprocess": interactions, "done": done.stdout}


@pytest.fixture()
def s3_env(cluster: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """This process reaches the cluster's object store (the pandas engine's runs)."""
    for name in (*_CREDENTIALS, "AWS_ENDPOINT_URL"):
        monkeypatch.setenv(name, cluster[name])


@pytest.mark.usefixtures("s3_env")
def test_preprocess_on_a_cluster_without_a_shared_disk_equals_pandas(  # type: ignore[no-untyped-def]
        cli, cluster: dict[str, str], published: dict[str, str], tmp_path: Path) -> None:
    assert f"master {cluster['MASTER']}" in published["done"]
    code, _, err = cli("preprocess", "--input", published["raw"], "--output",
                       tmp_path / "pandas")
    assert code == 0, err
    pandas: pa.Table = pq.read_table(tmp_path / "pandas" / INTERACTIONS)
    assert pandas.num_rows > 0 and _parts_table(published["preprocess"]).equals(pandas)


@pytest.mark.usefixtures("s3_env")
def test_split_on_a_cluster_without_a_shared_disk_equals_pandas(  # type: ignore[no-untyped-def]
        cli, cluster: dict[str, str], published: dict[str, str], tmp_path: Path) -> None:
    split = f"s3://vaecf-cluster/split-{tmp_path.name}"
    done = _vaecf(cluster, "split", "--input", published["preprocess"], "--output", split,
                  "--engine", "spark")
    assert done.returncode == 0, _said(done)
    code, _, err = cli("split", "--input", published["preprocess"], "--output",
                       tmp_path / "split-pandas")
    assert code == 0, err
    download_dir(split, tmp_path / "split-spark")
    # the tasks wrote the split's parts (no NPZ assembled by the driver)
    assert PART_FILES in read_manifest(tmp_path / "split-spark", "dataset")
    assert_same_split(tmp_path / "split-spark", tmp_path / "split-pandas")


def test_no_executor_sees_a_driver_local_path(cli, cluster: dict[str, str],  # type: ignore[no-untyped-def]
                                              tmp_path: Path) -> None:
    """A driver-local input (in the drivers' temporary folder, hidden from the workers) read
    on the cluster: the executors' tasks cannot open it and the stage fails."""
    from test_spark_engine import _pairs
    from test_split_stage import interactions

    source = interactions(Path(cluster["TMPDIR"]) / f"local-{tmp_path.name}", _pairs(False))
    try:
        done = _vaecf(cluster, "split", "--input", source, "--output", tmp_path / "out",
                      "--engine", "spark")
    finally:
        shutil.rmtree(source)
    said = done.stdout + done.stderr
    assert done.returncode != 0
    # the executor's line (the error's text is cut at a length, so its end may be missing)
    assert f"{source / INTERACTIONS}" in said and "No such file" in said
    assert not (tmp_path / "out").exists()
