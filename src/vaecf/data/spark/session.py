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
def spark_session() -> Iterator[Any]:
    """The active SparkSession (a test's, a notebook's), else a new one, stopped on exit."""
    check_pyspark()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        log.info(f"spark: running in the active session (master {active.sparkContext.master})")
        yield active
        return
    builder = SparkSession.builder.appName("vaecf")
    for key, value in _DEFAULTS.items():
        builder = builder.config(key, value)
    # Python workers run PYSPARK_PYTHON, else PATH's python3: this interpreter by default.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if "SPARK_CONF_DIR" not in os.environ:
        quiet = Path(__file__).with_name("log4j2.properties")
        builder = builder.config("spark.driver.extraJavaOptions",
                                 f"-Dlog4j.configurationFile=file:{quiet}")
    try:
        session = builder.getOrCreate()
    except Exception as err:  # Java missing or too old: py4j raises a bare Exception
        raise VaecfError(f"--engine spark: cannot start Spark ({str(err)[:200]}); "
                         "it needs Java 17 (JAVA_HOME or java on PATH)") from None
    session.sparkContext.setLogLevel("ERROR")
    log.info(f"spark: started Spark {session.version}, master {session.sparkContext.master}")
    try:
        yield session
    finally:
        session.stop()
