# syntax=docker/dockerfile:1
# The Spark image: `vaecf preprocess | split --engine spark` as a Spark application, its driver
# and executors in Kubernetes pods (the Kubeflow Spark Operator's SparkApplication, or
# spark-submit's cluster mode), or on its own in Spark's local mode. Spark is the one that
# PySpark's wheel bundles (spark-submit and the jars, in SPARK_HOME), so PySpark and the image's
# Spark are one version by construction. Build from the repository root:
#   docker build -f docker/spark.Dockerfile -t vaecf-spark:0.1.0 .
# A SparkApplication runs it with mainApplicationFile local:///opt/vaecf/main.py and the stage's
# command line as arguments (preprocess --engine spark --input ... --output ...); the entrypoint
# (docker/spark-entrypoint.sh) starts the `driver` and `executor` pods as Spark on Kubernetes
# asks, and runs any other command as given, e.g. in local mode:
#   docker run --rm -v "$PWD/data:/data" vaecf-spark:0.1.0 \
#     vaecf preprocess --engine spark --input /data/raw --output /data/interactions
# It runs as uid 185 (Spark's images' user), whose home is the working folder.
#
# The base is pinned by tag; pin its digest too for byte-reproducible builds
# (`docker buildx imagetools inspect python:3.11.11-slim-bookworm`).
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    JAVA_HOME=/usr/lib/jvm/java-17 \
    SPARK_HOME=/opt/vaecf/spark \
    PYSPARK_PYTHON=python3

# Java 17 for Spark's JVM: Debian 12's headless JRE, nothing recommended. The slim base has no
# /usr/share/man, where the JRE's postinst links its man pages (and fails without the folder).
# JAVA_HOME is a link to the JRE's folder, whose name holds the architecture.
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "$(dirname "$(dirname "$(readlink -f /usr/bin/java)")")" "$JAVA_HOME" \
 && "$JAVA_HOME/bin/java" -version

COPY requirements.lock pyproject.toml README.md /build/
COPY src /build/src

# vaecf with its `spark` extra under the lock's exact pins, the lock as constraints: the data
# stages' dependencies and PySpark's (py4j), no TensorFlow, kfp or Horovod. Every installed
# distribution must be one of the lock's pins (a constraint does not stop pip from adding a
# package the lock lacks; this check does), and `pip check` fails the build on a missing or
# conflicting dependency. SPARK_HOME links to PySpark's folder.
RUN pip install -c /build/requirements.lock "/build[spark]" \
 && unpinned=$(pip freeze --exclude vaecf | grep -vxFf /build/requirements.lock || true) \
 && if [ -n "$unpinned" ]; then echo "not pinned by requirements.lock: $unpinned"; exit 1; fi \
 && pip check \
 && mkdir -p /opt/vaecf \
 && ln -s "$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" "$SPARK_HOME" \
 && rm -rf /build

COPY docker/spark-entrypoint.sh /opt/vaecf/entrypoint.sh
COPY docker/spark-main.py /opt/vaecf/main.py

RUN groupadd --gid 185 spark \
 && useradd --create-home --uid 185 --gid 185 --shell /usr/sbin/nologin spark
USER 185:185
WORKDIR /home/spark

ENTRYPOINT ["/opt/vaecf/entrypoint.sh"]
CMD ["vaecf", "--help"]
