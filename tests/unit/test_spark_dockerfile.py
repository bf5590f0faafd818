"""The Spark image (docker/spark.Dockerfile) and its entrypoint (docker/spark-entrypoint.sh).

`make image-check` builds the image and runs the stages in it; these checks keep its contract
with the SparkApplication (main file, user, entrypoint modes) and its pins honest without
building. The entrypoint's command lines are read from stand-ins for `java` and `spark-submit`
that print their arguments; tests/stages/test_spark_entrypoint.py runs the real ones."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILE = (DOCKER / "spark.Dockerfile").read_text()
ENTRYPOINT = DOCKER / "spark-entrypoint.sh"
LOCK = dict(line.split("==") for line in (ROOT / "requirements.lock").read_text().splitlines()
            if "==" in line and not line.startswith("#"))
EXECUTOR_ENV = {
    "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@driver-svc.ns.svc:7078",
    "SPARK_EXECUTOR_ID": "3", "SPARK_EXECUTOR_CORES": "2", "SPARK_EXECUTOR_MEMORY": "1024m",
    "SPARK_APPLICATION_ID": "spark-0123abcd", "SPARK_EXECUTOR_POD_IP": "10.1.2.3",
    "SPARK_RESOURCE_PROFILE_ID": "0", "SPARK_EXECUTOR_POD_NAME": "vaecf-preprocess-exec-3",
}


def instructions(name: str) -> list[str]:
    """The arguments of each `name` instruction, its continuation lines joined."""
    logical = re.sub(r"\\\n\s*", " ", DOCKERFILE).splitlines()
    return [line.split(None, 1)[1] for line in logical if line.startswith(name + " ")]


def test_installs_vaecf_spark_under_the_lock_and_nothing_unpinned() -> None:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["spark"]
    assert extra == [f"pyspark=={LOCK['pyspark']}"]
    assert 'pip install -c /build/requirements.lock "/build[spark]"' in DOCKERFILE
    assert "grep -vxFf /build/requirements.lock" in DOCKERFILE  # every installed pin is the lock's
    assert "pip check" in DOCKERFILE


def test_lock_pins_what_pyspark_requires() -> None:
    """The installed PySpark (the lock's) accepts the py4j the lock pins."""
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement

    assert version("pyspark") == LOCK["pyspark"]
    (py4j,) = [Requirement(r) for r in requires("pyspark") or [] if r.startswith("py4j")]
    assert py4j.marker is None and LOCK["py4j"] in py4j.specifier


def test_java_17_headless_only_and_java_home() -> None:
    (apt,) = [run for run in instructions("RUN") if "apt-get install" in run]
    assert apt.split("apt-get install", 1)[1].split("&&")[0].split() == [
        "-y", "--no-install-recommends", "openjdk-17-jre-headless"]
    env = " ".join(instructions("ENV"))
    assert "JAVA_HOME=/usr/lib/jvm/java-17" in env and "PYSPARK_PYTHON=python3" in env
    assert "SPARK_HOME=/opt/vaecf/spark" in env


def test_runs_as_uid_185_in_its_own_home() -> None:
    assert instructions("USER") == ["185:185"]
    assert "useradd --create-home --uid 185 --gid 185" in DOCKERFILE
    assert "groupadd --gid 185 spark" in DOCKERFILE
    assert instructions("WORKDIR") == ["/home/spark"]  # useradd's home for user spark


def test_main_file_and_entrypoint_are_where_the_sparkapplication_expects() -> None:
    copies = instructions("COPY")
    assert "docker/spark-main.py /opt/vaecf/main.py" in copies
    assert "docker/spark-entrypoint.sh /opt/vaecf/entrypoint.sh" in copies
    assert json.loads(instructions("ENTRYPOINT")[0]) == ["/opt/vaecf/entrypoint.sh"]
    assert json.loads(instructions("CMD")[0]) == ["vaecf", "--help"]
    assert os.access(ENTRYPOINT, os.X_OK)
    mode = subprocess.run(["git", "ls-files", "-s", "docker/spark-entrypoint.sh"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    assert mode.startswith("100755 ")  # what a fresh clone (CI, docker build) gets


def test_main_file_runs_vaecf_with_its_arguments() -> None:
    """What spark-submit's PythonRunner does with local:///opt/vaecf/main.py: python3 main.py
    ARGS; vaecf's exit status is the application's."""
    main = str(DOCKER / "spark-main.py")
    done = subprocess.run([sys.executable, main, "--version"], capture_output=True, text=True)
    assert (done.returncode, done.stdout.strip()) == (0, "0.1.0")
    done = subprocess.run([sys.executable, main, "no-such-stage"], capture_output=True,
                          text=True)
    assert done.returncode == 1
    assert done.stderr.startswith("vaecf: error: unknown stage 'no-such-stage'")


def stand_in(tmp_path: Path, name: str) -> Path:
    """A program that prints its arguments one per line, then SPARK_HOME and PYSPARK_PYTHON."""
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n'
                    'echo "SPARK_HOME=$SPARK_HOME PYSPARK_PYTHON=$PYSPARK_PYTHON"\n')
    path.chmod(0o755)
    return path


def entrypoint(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"]}
    return subprocess.run([str(ENTRYPOINT), *args], env={**base, **env}, capture_output=True,
                          text=True, timeout=60)


def test_driver_runs_spark_submit_in_client_mode_on_the_pods_address(tmp_path: Path) -> None:
    stand_in(tmp_path / "spark", "bin/spark-submit")
    args = ["--properties-file", "/opt/spark/conf/spark.properties", "--class",
            "org.apache.spark.deploy.PythonRunner", "local:///opt/vaecf/main.py",
            "preprocess", "--engine", "spark", "--input", "s3://b/raw dir"]
    done = entrypoint("driver", *args, env={"SPARK_HOME": str(tmp_path / "spark"),
                                            "SPARK_DRIVER_BIND_ADDRESS": "10.1.2.9"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "--deploy-mode", "client", "--conf", "spark.driver.bindAddress=10.1.2.9", *args,
        f"SPARK_HOME={tmp_path / 'spark'} PYSPARK_PYTHON=python3"]
    # Without the pod's address, spark-submit binds where Spark would by itself.
    done = entrypoint("driver", *args, env={"SPARK_HOME": str(tmp_path / "spark")})
    assert done.stdout.splitlines()[:3] == ["--deploy-mode", "client", "--properties-file"]


def test_executor_runs_the_kubernetes_backend_from_the_pods_environment(tmp_path: Path) -> None:
    stand_in(tmp_path / "jre", "bin/java")
    # SPARK_JAVA_OPT_<n> in n's numeric order (10 after 2), each one argument, spaces and all.
    opts = {f"SPARK_JAVA_OPT_{n}": f"-Dopt.{n}=v {n}" for n in (0, 1, 2, 10)}
    env = {**EXECUTOR_ENV, **opts, "JAVA_HOME": str(tmp_path / "jre"), "SPARK_HOME": "/spark",
           "SPARK_CONF_DIR": "/opt/spark/conf", "SPARK_CLASSPATH": "/extra/a.jar",
           "SPARK_EXTRA_CLASSPATH": "/image/b.jar", "PYSPARK_PYTHON": "/usr/bin/python3.11"}
    done = entrypoint("executor", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "-Dopt.0=v 0", "-Dopt.1=v 1", "-Dopt.2=v 2", "-Dopt.10=v 10",
        "-Xms1024m", "-Xmx1024m",
        "-cp", "/opt/spark/conf:/extra/a.jar:/spark/jars/*:/image/b.jar",
        "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend",
        "--driver-url", EXECUTOR_ENV["SPARK_DRIVER_URL"], "--executor-id", "3",
        "--cores", "2", "--app-id", "spark-0123abcd", "--hostname", "10.1.2.3",
        "--resourceProfileId", "0", "--podName", "vaecf-preprocess-exec-3",
        "SPARK_HOME=/spark PYSPARK_PYTHON=/usr/bin/python3.11"]


@pytest.mark.parametrize("unset", ["SPARK_DRIVER_URL", "SPARK_EXECUTOR_POD_NAME"])
def test_executor_without_the_drivers_environment_fails_in_one_line(tmp_path: Path,
                                                                    unset: str) -> None:
    java = stand_in(tmp_path / "jre", "bin/java")
    env = {k: v for k, v in EXECUTOR_ENV.items() if k != unset}
    done = entrypoint("executor", env={**env, "JAVA_HOME": str(java.parents[1]),
                                       "SPARK_HOME": "/spark"})
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.splitlines() == [
        f"spark-entrypoint: executor: {unset} not set (the driver sets them on executor pods)"]


def test_anything_else_runs_as_given_with_pysparks_spark_home() -> None:
    """`vaecf ...` as in the other images; SPARK_HOME is PySpark's folder unless set."""
    python_bin = str(Path(sys.executable).parent)
    done = entrypoint("sh", "-c", 'echo "$SPARK_HOME $PYSPARK_PYTHON"; exit 7',
                      env={"PATH": f"{python_bin}:{os.environ['PATH']}"})
    import pyspark

    assert done.returncode == 7
    assert done.stdout.split() == [str(Path(pyspark.__file__).parent), "python3"]
    done = entrypoint("vaecf", "--version", env={
        "PATH": f"{python_bin}:{os.environ['PATH']}", "SPARK_HOME": "/given",
        "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    assert (done.returncode, done.stdout.strip()) == (0, "0.1.0")


def test_image_is_listed_everywhere_images_are() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^IMAGES := .*\bspark\b", makefile, re.MULTILINE)
    (names,) = re.findall(r"^NAMES = (\(.*\))$", (ROOT / "components" / "images.py").read_text(),
                          re.MULTILINE)
    assert "spark" in ast.literal_eval(names)  # the names `make push` may record digests of
    check = (DOCKER / "check-images.sh").read_text()
    assert re.search(r"^IMAGES=\(.*\bspark\b.*\)$", check, re.MULTILINE)
    assert "[spark]=check_spark" in check
    images = ROOT / "docs" / "reference" / "images.md"
    assert "| `vaecf-spark` | `docker/spark.Dockerfile` |" in images.read_text()
