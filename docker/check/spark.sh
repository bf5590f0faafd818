# shellcheck shell=bash
# vaecf-spark: Spark's local mode and the entrypoint's driver and executor modes (sourced by
# docker/check-images.sh).

# in_spark USER CMD...: CMD in the Spark image with Spark on loopback: the container's hostname
# (buildah's) does not resolve, unlike a pod's, and Spark looks its address up otherwise.
in_spark() {
  local user=$1
  shift
  in_image spark "$user" env SPARK_LOCAL_IP=127.0.0.1 "$@"
}

# The Spark image: its configuration (user 185, Spark's convention, and the entrypoint), Java 17,
# PySpark at the lock's version and spark-submit at the same, no TensorFlow; then, on a tiny
# synthetic dataset, preprocess and split with --engine spark in Spark's local mode as uid 185,
# and preprocess again as a Spark application through the entrypoint's driver and executor modes
# (docker/spark-driver-executor.sh); both preprocess outputs hold the same interactions and every
# manifest says engine spark. An arbitrary uid is refused in one line (Spark needs a passwd
# entry, see the entrypoint).
check_spark() {
  local image=vaecf-spark:$TAG dir=$CHECK_DIR/data/spark config out pin versions
  rm -rf "$dir"
  mkdir -p "$dir/driver"
  chown -R 185:185 "$dir"
  cp docker/spark-driver-executor.sh "$dir/"
  config=$(buildah inspect --type image --format '{{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}' "$image")
  [ "$config" = '185:185 [/opt/vaecf/entrypoint.sh]' ] \
    || fail "$image: user and entrypoint are $config, not 185:185 [/opt/vaecf/entrypoint.sh]"
  out=$(buildah run --isolation chroot "${CONTAINERS[spark]}" -- id -u)
  [ "$out" = 185 ] || fail "$image runs as uid $out, not 185"
  say "spark: Java, Spark and PySpark versions as uid 185"
  out=$(in_spark 185:185 sh -c 'java -version 2>&1')
  grep -q '^openjdk version "17\.' <<< "$out" || fail "$image: java is not 17: $out"
  pin=$(sed -n 's/^pyspark==//p' requirements.lock)
  versions=$(in_spark 185:185 sh -c '"$SPARK_HOME/bin/spark-submit" --version 2>&1 \
      | sed -n "s/.*version \([0-9][0-9.]*\)$/spark-submit \1/p" | head -n 1; \
    python -c "import pyspark; print(\"pyspark\", pyspark.__version__)"')
  [ "$versions" = "spark-submit $pin"$'\n'"pyspark $pin" ] \
    || fail "$image: spark-submit and pyspark are not both requirements.lock's $pin: $versions"
  # Hadoop's login in Spark's JVM needs a passwd entry: an unknown uid gets one line, exit 1.
  out=$(in_spark "$RUN_UID" sh -c '/opt/vaecf/entrypoint.sh driver --version 2>&1') \
    && fail "$image: the driver ran as uid $RUN_UID, which has no passwd entry"
  [ "$out" = "spark-entrypoint: driver: uid ${RUN_UID%%:*} has no passwd entry, which Spark needs; run as uid 185 (user spark)" ] \
    || fail "$image: the driver as uid $RUN_UID should fail in one line: $out"
  in_spark 185:185 sh -c 'test ! -e /build && ! pip list 2>/dev/null | grep -qiE "^(tensorflow|keras|kfp) "' \
    || fail "$image holds build files or TensorFlow"
  say "spark: download, then preprocess and split --engine spark in local mode, as uid 185"
  in_spark 185:185 vaecf download --dataset synthetic --synthetic-users 200 \
    --synthetic-items 80 --output /data/spark/raw
  in_spark 185:185 vaecf preprocess --engine spark --input /data/spark/raw \
    --output /data/spark/interactions
  in_spark 185:185 vaecf split --engine spark --input /data/spark/interactions \
    --output /data/spark/split
  say "spark: preprocess through the entrypoint's driver and executor modes as uid 185"
  in_spark 185:185 /data/spark/spark-driver-executor.sh \
    /data/spark/driver/logs local:///opt/vaecf/main.py preprocess --engine spark \
    --input /data/spark/raw --output /data/spark/driver/interactions \
    || fail "$image: the driver and executor run failed (logs: $dir/driver/logs)"
  out=$(in_spark 185:185 python -c '
import json
import pyarrow.parquet as pq
local, driver, split = "/data/spark/interactions", "/data/spark/driver/interactions", "/data/spark/split"
manifests = [json.load(open(f"{d}/{s}_manifest.json"))
             for d, s in ((local, "preprocess"), (driver, "preprocess"), (split, "dataset"))]
assert [m["engine"] for m in manifests] == ["spark"] * 3, [m["engine"] for m in manifests]
assert manifests[0]["counts"] == manifests[1]["counts"], "counts differ"
tables = [pq.read_table(f"{d}/interactions.parquet") for d in (local, driver)]
assert tables[0].num_rows > 0 and tables[0].equals(tables[1]), "interactions differ"
print("spark ok")
') || fail "$image: the outputs: $out"
  grep -q '^spark ok$' <<< "$out" || fail "$image: the outputs: $out"
}
