"""Shared fixtures: a real S3 server on loopback (moto's server mode) and a CLI runner."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
# The time limit of a test marked slow: its longest run here, 88 s at a load of 15-19 on
# 2 cores (2026-11-28), three times over.
SLOW_TIMEOUT = 300
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


# The test files whose tests spawn horovodrun (the ``horovod`` mark). Under pytest-xdist
# (``make test``) they run on one worker, one after another: two ranks already fill the
# 2 cores, and two jobs at once would only race for them.
HOROVOD_FILES = ("tests/e2e/", "tests/horovod/", "tests/stages/test_benchmark_stage.py")


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``make test``'s two workers take whole test files (a module's fixtures, a trained model
    or a running server, are built once; the Spark engine's tests share one JVM), and the
    horovodrun files as one unit. (xdist's ``--dist loadgroup`` marks are lost under
    pytest 9.2, whose node ids xdist 3.8 can no longer rename.)"""
    from xdist.scheduler import LoadScopeScheduling

    class Files(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "horovod" if path.startswith(HOROVOD_FILES) else path

    return Files(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Time limits (pytest-timeout; pyproject.toml's ``timeout = 60`` for every other test): a
    test marked ``slow`` (real processes: horovodrun, a JVM, a ``vaecf train`` child stopped
    by a signal) may take ``SLOW_TIMEOUT`` seconds, so that a machine loaded by other work
    does not fail it; a test's own ``timeout`` mark wins. A horovodrun test outside
    ``HOROVOD_FILES`` is refused: it would run beside another on the second worker."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))
        if item.get_closest_marker("horovod") and not item.nodeid.startswith(HOROVOD_FILES):
            raise pytest.UsageError(f"{item.nodeid} is marked horovod: list its file in "
                                    "HOROVOD_FILES (tests/conftest.py)")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    from vaecf.serve.loadtest import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture()
def s3_bucket(s3_server: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
              ) -> str:
    """A fresh bucket on the loopback S3 server, with the environment pointing at it."""
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    name = "vaecf-" + request.node.name.lower().replace("_", "-")[:40].strip("-[]")
    name = "".join(c if c.isalnum() or c == "-" else "-" for c in name)
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def synthetic_split(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Factory of small split directories made by the real split code from planted data.

    ``synthetic_split(n_users=600, n_items=300, seed=0) -> Path``; the same arguments give the
    same directory within a session, so tests must treat it as read-only.
    """
    from vaecf.data.split import write_synthetic_split

    made: dict[tuple[int, int, int], Path] = {}

    def make(n_users: int = 600, n_items: int = 300, seed: int = 0) -> Path:
        key = (n_users, n_items, seed)
        if key not in made:
            directory = tmp_path_factory.mktemp(f"split-{n_users}-{n_items}-{seed}")
            write_synthetic_split(directory, n_users, n_items, seed, mean_items=40.0)
            made[key] = directory
        return made[key]

    return make


@pytest.fixture(scope="session")
def small_model(synthetic_split,  # type: ignore[no-untyped-def]
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model trained once per session on ``synthetic_split()`` (2 epochs, hidden 32,
    latent 8): for the stages that read a model (recommend, serve); tests treat it as
    read-only."""
    from vaecf.cli import main

    output = tmp_path_factory.mktemp("small-model") / "model"
    assert main(["train", "--split", str(synthetic_split()), "--output", str(output),
                 "--epochs", "2", "--batch-size", "100", "--hidden", "32", "--latent",
                 "8"]) == 0
    return output


@pytest.fixture()
def cli(capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """Run ``vaecf <argv>`` in process; returns (exit code, stdout, stderr)."""
    from vaecf.cli import main

    def run(*argv: str) -> tuple[int, str, str]:
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """One small local SparkSession (2 threads) for the Spark engine's tests; the stages'
    ``--engine spark`` finds it active and runs in it."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("vaecf-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.memory", "512m")
               # tiny inputs: the JIT's optimising tier and parallel GC cost more CPU than
               # they save on 2 shared cores
               .config("spark.driver.extraJavaOptions",
                       "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.session.timeZone", "UTC")
               # several sorted partitions even for tiny data: the global ranks add offsets
               .config("spark.sql.adaptive.coalescePartitions.enabled", "false")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
