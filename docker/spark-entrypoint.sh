#!/usr/bin/env bash
# The vaecf-spark image's entrypoint: the three ways Spark on Kubernetes (spark-submit's
# cluster mode, the Kubeflow Spark Operator) starts a Spark image's container, run with the
# Spark that PySpark's wheel bundles (bin/spark-submit, jars/) in SPARK_HOME.
#
#   driver ARGS...  the driver pod. Spark passes `driver --properties-file <spark.properties>
#                   --class <main class> <app> <app args>` (a Python app's class is
#                   org.apache.spark.deploy.PythonRunner, its app local:///opt/vaecf/main.py)
#                   and the pod's address in SPARK_DRIVER_BIND_ADDRESS. Runs spark-submit in
#                   client mode inside the pod, listening on that address.
#   executor        an executor pod. Everything comes from the environment the driver gave the
#                   pod: SPARK_DRIVER_URL, SPARK_EXECUTOR_ID, SPARK_EXECUTOR_CORES,
#                   SPARK_EXECUTOR_MEMORY, SPARK_APPLICATION_ID, SPARK_EXECUTOR_POD_IP,
#                   SPARK_RESOURCE_PROFILE_ID, SPARK_EXECUTOR_POD_NAME, the JVM options
#                   SPARK_JAVA_OPT_0, _1, ... and the class path additions SPARK_CLASSPATH
#                   (spark.executor.extraClassPath) and SPARK_EXTRA_CLASSPATH. Runs the JVM's
#                   KubernetesExecutorBackend, which registers with the driver.
#   anything else   run as given (`vaecf preprocess ...`, `bash`), as in vaecf's other images.
#
# Each mode ends in exec, so the JVM (or the command) is the container's main process and gets
# Kubernetes' SIGTERM itself.
set -euo pipefail

# PySpark's install folder, unless the image (or the caller) says where it is.
if [ -z "${SPARK_HOME:-}" ]; then
  SPARK_HOME=$(python3 -c \
    'import importlib.util as u; print(u.find_spec("pyspark").submodule_search_locations[0])')
  export SPARK_HOME
fi
# The Python of the driver's app and of the executors' Python workers (pandas UDFs).
export PYSPARK_PYTHON=${PYSPARK_PYTHON:-python3}

# Spark's JVM logs the user in through Hadoop, which fails with a NullPointerException deep in
# its start-up for a uid without a passwd entry (an arbitrary runAsUser): say so in one line.
require_passwd_entry() {
  if ! id -un >/dev/null 2>&1; then
    echo "spark-entrypoint: $1: uid $(id -u) has no passwd entry, which Spark needs;" \
      "run as uid 185 (user spark)" >&2
    exit 1
  fi
}

case "${1:-}" in
  driver)
    require_passwd_entry driver
    shift
    bind=()
    if [ -n "${SPARK_DRIVER_BIND_ADDRESS:-}" ]; then
      bind=(--conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS")
    fi
    exec "$SPARK_HOME/bin/spark-submit" --deploy-mode client "${bind[@]}" "$@"
    ;;
  executor)
    require_passwd_entry executor
    shift
    missing=()
    for name in SPARK_DRIVER_URL SPARK_EXECUTOR_ID SPARK_EXECUTOR_CORES SPARK_EXECUTOR_MEMORY \
        SPARK_APPLICATION_ID SPARK_EXECUTOR_POD_IP SPARK_RESOURCE_PROFILE_ID \
        SPARK_EXECUTOR_POD_NAME; do
      [ -n "${!name:-}" ] || missing+=("$name")
    done
    if [ ${#missing[@]} -gt 0 ]; then
      echo "spark-entrypoint: executor: ${missing[*]} not set (the driver sets them on" \
        "executor pods)" >&2
      exit 1
    fi
    # SPARK_JAVA_OPT_<n> in the order of n; each value is one option, spaces and all.
    java_opts=()
    for name in $(compgen -e | grep -E '^SPARK_JAVA_OPT_[0-9]+$' | sort -t_ -k4 -n); do
      java_opts+=("${!name}")
    done
    # The configuration folder first (log4j2.properties, Hadoop's *-site.xml), then the
    # executor's extra class path, Spark's jars, and the image's or pod's additions.
    classpath=${SPARK_CONF_DIR:-$SPARK_HOME/conf}
    classpath+=${HADOOP_CONF_DIR:+:$HADOOP_CONF_DIR}
    classpath+=${SPARK_CLASSPATH:+:$SPARK_CLASSPATH}
    classpath+=":$SPARK_HOME/jars/*"
    classpath+=${SPARK_EXTRA_CLASSPATH:+:$SPARK_EXTRA_CLASSPATH}
    exec "${JAVA_HOME:+$JAVA_HOME/bin/}java" "${java_opts[@]}" \
      "-Xms$SPARK_EXECUTOR_MEMORY" "-Xmx$SPARK_EXECUTOR_MEMORY" -cp "$classpath" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" \
      --cores "$SPARK_EXECUTOR_CORES" --app-id "$SPARK_APPLICATION_ID" \
      --hostname "$SPARK_EXECUTOR_POD_IP" --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
      --podName "$SPARK_EXECUTOR_POD_NAME"
    ;;
  *)
    exec "$@"
    ;;
esac
