#!/usr/bin/env bash
# spark-driver-executor.sh WORKDIR APP [APP ARGS...]: runs a Spark application through the Spark
# image's entrypoint as Spark on Kubernetes would, without a cluster: the entrypoint's `driver`
# mode (spark-submit in client mode, with the properties file and the --class Spark passes the
# driver pod), and then one executor started by the entrypoint's `executor` mode from the
# environment a driver gives an executor pod: the driver's URL and the JVM options its
# configuration holds for executors (spark.executor.extraJavaOptions, which the driver fills with
# Java 17's module options), one SPARK_JAVA_OPT_<n> each. The driver's master is a standalone
# cluster with no workers (local-cluster[0,...]), so every task runs in that executor. Loopback
# only. Exits with the driver's status; fails if the executor ran no task or did not exit.
#
# Used by `make image-check` inside the vaecf-spark image and by the tests on this machine.
# Environment: ENTRYPOINT (default /opt/vaecf/entrypoint.sh), TIMEOUT (seconds each process may
# run, default 600).
set -euo pipefail
work=$1
app=$2
shift 2
entrypoint=${ENTRYPOINT:-/opt/vaecf/entrypoint.sh}
mkdir -p "$work"

fail() { echo "spark-driver-executor: $*" >&2; exit 1; }

# One executor core and a tiny dataset: a few shuffle partitions, not Spark's 200.
cat > "$work/spark.properties" <<EOF
spark.master=local-cluster[0,1,1024]
spark.app.name=vaecf-driver-executor
spark.driver.host=127.0.0.1
spark.ui.enabled=false
spark.logConf=true
spark.sql.shuffle.partitions=4
EOF

SPARK_DRIVER_BIND_ADDRESS=127.0.0.1 timeout "${TIMEOUT:-600}" "$entrypoint" driver \
  --properties-file "$work/spark.properties" --class org.apache.spark.deploy.PythonRunner \
  "$app" "$@" > "$work/driver.log" 2>&1 &
driver=$!

# The driver's RPC port and its executors' JVM options, from its log (Spark's own INFO lines).
port= options=
while [ -z "$port" ] || [ -z "$options" ]; do
  kill -0 "$driver" 2>/dev/null || { tail -n 20 "$work/driver.log" >&2; fail "the driver exited early"; }
  sleep 1
  port=$(sed -n "s/.*Successfully started service 'sparkDriver' on port \([0-9]*\)\..*/\1/p" \
    "$work/driver.log" | head -n 1)
  options=$(sed -n 's/^spark\.executor\.extraJavaOptions=//p' "$work/driver.log" | head -n 1)
done

# SPARK_JAVA_OPT_<n>: the options split at spaces, as Spark splits them (these hold no quotes).
read -r -a opts <<< "$options"
java_opts=()
for i in "${!opts[@]}"; do java_opts+=("SPARK_JAVA_OPT_$i=${opts[$i]}"); done
env "${java_opts[@]}" SPARK_DRIVER_URL="spark://CoarseGrainedScheduler@127.0.0.1:$port" \
  SPARK_EXECUTOR_ID=1 SPARK_EXECUTOR_CORES=1 SPARK_EXECUTOR_MEMORY=1g \
  SPARK_APPLICATION_ID=vaecf-driver-executor SPARK_EXECUTOR_POD_IP=127.0.0.1 \
  SPARK_RESOURCE_PROFILE_ID=0 SPARK_EXECUTOR_POD_NAME=vaecf-driver-executor-exec-1 \
  timeout "${TIMEOUT:-600}" "$entrypoint" executor > "$work/executor.log" 2>&1 &
executor=$!

status=0
wait "$driver" || status=$?
# The driver's end stops its executors; one still running after a minute is a failure.
for _ in $(seq 60); do kill -0 "$executor" 2>/dev/null || break; sleep 1; done
if kill -0 "$executor" 2>/dev/null; then kill "$executor"; fail "the executor did not exit"; fi
wait "$executor" || true
[ "$status" = 0 ] || { tail -n 20 "$work/driver.log" >&2; fail "the driver failed ($status)"; }
tasks=$(grep -c 'Executor: Finished task' "$work/executor.log" || true)
[ "$tasks" -gt 0 ] || { tail -n 20 "$work/executor.log" >&2; fail "the executor ran no task"; }
echo "spark-driver-executor: driver exit 0, $tasks tasks in the executor"
