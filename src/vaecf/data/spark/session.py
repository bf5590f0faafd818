"""The SparkSession a stage runs in: the active one, else a new one it stops at the end."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vaecf import log
from vaecf.errors import VaecfError
from vaecf.io.publish import scratch

# Quiet, loopback-only defaults for a session vaecf starts itself; spark-submit's --conf,
# spark-defaults.conf and a master given by spark-submit or the MASTER variable still win
# (the master is not set here: Spark's own default is local[*]).
_DEFAULTS = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
}


def check_pyspark() -> None:
    """One line saying how to install PySpark, if it is missing."""
    try:
        import pyspark.sql  # noqa: F401
    except ImportError:
        raise VaecfError("--engine spark: PySpark is not installed (pip install "
                         "'vaecf[spark]'; it needs Java 17)") from None


@contextmanager
def spark_session(staging: Path) -> Iterator[Any]:
    """The active SparkSession (a test's, a notebook's), else a new one, stopped on exit.

    A session vaecf starts itself keeps its files with the stage's: Spark's local dirs
    (``blockmgr-*``, ``spark-*``) and the JVM's temporary files go in a scratch folder of
    ``staging``'s area (``vaecf.io.publish.scratch``), removed with it, and by the next run
    of the stage if this one is killed, never left in ``/tmp``. The JVM's own stderr (its
    banner: ``Using incubator modules``, ``Setting default log level``) goes to a file there
    too, so that a stage's error stays one line; its last lines are logged on stdout if
    Spark itself fails. ``SPARK_LOCAL_DIRS`` (a cluster's) still wins.
    """
    check_pyspark()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        log.info(f"spark: running in the active session (master {active.sparkContext.master})")
        yield active
        return
    with scratch(staging) as work:
        jvm_log = work / "jvm.log"
        session = _start(SparkSession.builder, work, jvm_log)
        try:
            yield session
        except VaecfError:  # bad input, said in one line: the JVM has nothing to add
            raise
        except BaseException:
            _show_tail(jvm_log)
            raise
        finally:
            session.stop()


def _start(builder: Any, work: Path, jvm_log: Path) -> Any:
    """A new session whose files lie in ``work`` and whose JVM writes its stderr to
    ``jvm_log``."""
    builder = builder.appName("vaecf")
    for key, value in {**_DEFAULTS, "spark.local.dir": str(work)}.items():
        builder = builder.config(key, value)
    # Python workers run PYSPARK_PYTHON, else PATH's python3: this interpreter by default.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    options = [f"-Djava.io.tmpdir={work}"]
    if "SPARK_CONF_DIR" not in os.environ:
        quiet = Path(__file__).with_name("log4j2.properties")
        options.append(f"-Dlog4j.configurationFile=file:{quiet}")
    builder = builder.config("spark.driver.extraJavaOptions", " ".join(options))
    try:
        with _stderr_to(jvm_log):  # the JVM is started here and keeps this stderr
            session = builder.getOrCreate()
    except Exception as err:  # Java missing or too old: py4j raises a bare Exception
        said = _last_lines(jvm_log, 1)
        raise VaecfError(f"--engine spark: cannot start Spark ({str(err)[:200]}"
                         f"{'; ' + said[0][:200] if said else ''}); it needs Java 17 "
                         "(JAVA_HOME or java on PATH)") from None
    session.sparkContext.setLogLevel("ERROR")
    log.info(f"spark: started Spark {session.version}, master {session.sparkContext.master}, "
             f"local dirs in {session.conf.get('spark.local.dir')}")
    return session


@contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """File descriptor 2 (what a child process inherits) on ``path`` for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "ab") as handle:
            os.dup2(handle.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _last_lines(path: Path, count: int) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - 64 * 1024))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-count:]


def _show_tail(jvm_log: Path) -> None:
    """The JVM's last lines on stdout (the log), for a stage that failed."""
    for line in _last_lines(jvm_log, 20):
        log.info(f"spark: jvm: {line[:500]}")
