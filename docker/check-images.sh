#!/usr/bin/env bash
# check-images.sh [IMAGE...]: builds the data, launcher, both train images (CPU and GPU
# flavours), the serve and the Spark image with buildah (no Docker daemon, no registry) and runs
# them: a data stage under an arbitrary uid, `vaecf launch-mpijob --help`, `horovodrun
# --check-build` in both train images (NCCL in the GPU one), `horovodrun -np 2` of a short `vaecf
# train` on a tiny synthetic split that the data image made (CPU flavour), `vaecf train --help`
# in the GPU flavour (no GPU here to train on), `vaecf serve` of the model so trained (one v1 and
# one v2 request on loopback, then SIGTERM and exit status 0), and in the Spark image preprocess
# and split with `--engine spark` in Spark's local mode and preprocess through the entrypoint's
# driver and executor modes (see check_spark). Each image is removed once checked, in two phases
# (the GPU train image alone in the second), so that the disk holds at most ~30 GB of them. Run
# by `make image-check`; needs root (buildah's storage, debootstrap) and installs its own
# prerequisites with apt-get on Debian. Given IMAGE names (of IMAGES below), it builds and checks
# only those and the images whose outputs their checks use (serve: train-cpu's model, train-cpu:
# data's split).
#
# The pinned base python:3.11.11-slim-bookworm cannot be pulled here (no registry), so a
# stand-in of the same name is bootstrapped with debootstrap. It differs from the real base:
#   - Python is Debian 12's python3.11 (3.11.2 in /usr/bin, linked from /usr/local/bin/python,
#     python3, python3.11, pip, pip3), not 3.11.11 built from source in /usr/local;
#   - pip is Debian's python3-pip 23.0.1 (with Debian's setuptools and wheel in
#     /usr/lib/python3/dist-packages), not pip 24.0; Debian's EXTERNALLY-MANAGED marker is
#     removed, as the real base has none;
#   - it is a debootstrap minbase (apt, dpkg, coreutils, ...) plus ca-certificates, netbase
#     and tzdata, close to debian:bookworm-slim but not its exact package set and trimmed files;
#   - it carries this host's CA bundle (/etc/ssl/host-ca-bundle.crt) and an /etc/pip.conf
#     that makes pip trust it, so that pip inside the builds reaches PyPI through a proxy that
#     intercepts TLS the way the host's pip does; the real base has neither.
# The images' own layers are built from the unchanged Dockerfiles.
#
# Environment: STORAGE_DRIVER (overlay where the kernel allows it, else vfs), CHECK_DIR
# (work files and the cached base tarball; default build/image-check), DEBIAN_MIRROR.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=docker.io/library/python:3.11.11-slim-bookworm
TAG=check
CHECK_DIR=${CHECK_DIR:-$PWD/build/image-check}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
RUN_UID=4242:4242  # any uid the images do not know
start=$(date +%s)

say() { echo "image-check [$(( $(date +%s) - start ))s]: $*"; }
fail() { echo "image-check: FAILED: $*" >&2; exit 1; }

install_prerequisites() {
  local missing=()
  command -v buildah >/dev/null || missing+=(buildah)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  [ ${#missing[@]} -eq 0 ] && return
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
}

pick_storage_driver() {
  [ -n "${STORAGE_DRIVER:-}" ] && return
  local t
  t=$(mktemp -d)
  mkdir "$t"/{l,u,w,m}
  if mount -t overlay overlay -o "lowerdir=$t/l,upperdir=$t/u,workdir=$t/w" "$t/m" 2>/dev/null; then
    umount "$t/m"; STORAGE_DRIVER=overlay
  else
    STORAGE_DRIVER=vfs
  fi
  rm -rf "$t"
  export STORAGE_DRIVER
}

# The stand-in base (see the header). The debootstrap tarball is cached in CHECK_DIR.
stand_in_base() {
  if buildah inspect --type image "$BASE" >/dev/null 2>&1; then
    say "stand-in $BASE exists"; return
  fi
  local tarball=$CHECK_DIR/bookworm-python3.11.tar root
  if [ ! -f "$tarball" ]; then
    say "debootstrap bookworm with python3.11"
    root=$(mktemp -d)
    debootstrap --variant=minbase \
      --include=python3.11,python3.11-venv,python3-pip,ca-certificates,netbase,tzdata \
      bookworm "$root" "$MIRROR" > "$CHECK_DIR/debootstrap.log" 2>&1 \
      || { tail -n 20 "$CHECK_DIR/debootstrap.log"; fail "debootstrap"; }
    for name in python python3 python3.11; do ln -s /usr/bin/python3.11 "$root/usr/local/bin/$name"; done
    for name in pip pip3; do ln -s /usr/bin/pip3 "$root/usr/local/bin/$name"; done
    rm -f "$root"/usr/lib/python3.11/EXTERNALLY-MANAGED
    cp "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" "$root/etc/ssl/host-ca-bundle.crt"
    printf '[global]\ncert = /etc/ssl/host-ca-bundle.crt\n' > "$root/etc/pip.conf"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf "$root"
  fi
  say "importing the stand-in as $BASE"
  local ctr
  ctr=$(buildah from scratch)
  buildah add -q "$ctr" "$tarball" / >/dev/null
  buildah config --env PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 "$ctr"
  buildah commit -q --rm "$ctr" "$BASE" >/dev/null
}

build() {  # build NAME DOCKERFILE [ARGS...]: logs to CHECK_DIR/NAME.log
  local name=$1 file=$2 began=$SECONDS
  shift 2
  if ! buildah bud --isolation chroot --pull=never --layers=false --force-rm -f "$file" "$@" \
      -t "vaecf-$name:$TAG" . > "$CHECK_DIR/build-$name.log" 2>&1; then
    tail -n 40 "$CHECK_DIR/build-$name.log"; fail "building vaecf-$name (log: $CHECK_DIR/build-$name.log)"
  fi
  say "built vaecf-$name:$TAG in $((SECONDS - began)) s"
}

# One working container per image for all its checks (each `buildah from` is a full copy of
# the image with the vfs driver). Each phase removes its containers and images when its checks
# pass, and the exit trap whatever is left, so a run leaves only the stand-in base behind.
IMAGES=(data launcher train-cpu serve spark train)
declare -A CONTAINERS=()
declare -A USES=([train-cpu]=data [serve]=train-cpu)  # the image whose output a check uses
declare -A CHECKS=([data]=check_data [launcher]=check_launcher [train-cpu]=check_train
                   [serve]=check_serve [spark]=check_spark)  # the first phase's checks
WANTED=()  # the images to build and check, all by default
want() {  # want IMAGE...: adds each image and what its check uses to WANTED
  local image
  for image in "$@"; do
    [[ " ${IMAGES[*]} " == *" $image "* ]] || fail "unknown image '$image' (one of: ${IMAGES[*]})"
    [ -z "${USES[$image]:-}" ] || want "${USES[$image]}"
    wanted "$image" || WANTED+=("$image")
  done
}
wanted() { [[ " ${WANTED[*]} " == *" $1 "* ]]; }
remove_images() {  # remove_images IMAGE...: their working containers, then the images
  local image
  for image in "$@"; do
    if [ -n "${CONTAINERS[$image]:-}" ]; then
      buildah rm "${CONTAINERS[$image]}" >/dev/null || true
      unset "CONTAINERS[$image]"
    fi
    buildah rmi "vaecf-$image:$TAG" >/dev/null 2>&1 || true
  done
}
open_containers() {  # open_containers IMAGE...
  local image
  for image in "$@"; do
    CONTAINERS[$image]=$(buildah from --pull=never "vaecf-$image:$TAG")
  done
}

# The peak disk use of the run, sampled every 5 s on the filesystems of buildah's storage and
# of its temporary files (a commit stages the whole image there): what CI's disk must hold.
GRAPH_ROOT= DISK_LOG=
disk_used() {
  df -B1 --output=source,used "$GRAPH_ROOT" "${TMPDIR:-/var/tmp}" \
    | awk 'NR > 1 && !seen[$1]++ {used += $2} END {print used}'
}
start_disk_sampler() {
  GRAPH_ROOT=$(buildah info --format '{{.store.GraphRoot}}')
  DISK_LOG=$CHECK_DIR/disk-used.log
  say "$(df -h --output=avail "$GRAPH_ROOT" | tail -n 1 | tr -d ' ') free for buildah's storage ($GRAPH_ROOT)"
  disk_used > "$DISK_LOG"
  while sleep 5; do disk_used >> "$DISK_LOG"; done &
}
peak_disk() {  # the most used above the first sample, in GB (10^9 bytes)
  disk_used >> "$DISK_LOG"
  awk 'NR == 1 {base = $1} $1 > peak {peak = $1} END {printf "%.1f GB", (peak - base) / 1e9}' "$DISK_LOG"
}
cleanup() {  # the disk sampler and a build still running when a check failed, then the images
  local jobs
  jobs=$(jobs -p)
  [ -z "$jobs" ] || kill $jobs 2>/dev/null || true
  remove_images "${IMAGES[@]}"
}

# in_image IMAGE USER CMD...: runs CMD in IMAGE's container with CHECK_DIR/data at /data.
in_image() {
  local image=$1 user=$2
  shift 2
  buildah run --isolation chroot --user "$user" -v "$CHECK_DIR/data:/data" \
    "${CONTAINERS[$image]}" -- "$@"
}

check_data() {
  rm -rf "$CHECK_DIR/data"
  mkdir -p "$CHECK_DIR/data"
  chown "$RUN_UID" "$CHECK_DIR/data"
  say "data stages as uid $RUN_UID"
  in_image data "$RUN_UID" vaecf download --dataset synthetic --synthetic-users 300 \
    --synthetic-items 120 --output /data/raw
  in_image data "$RUN_UID" vaecf preprocess --input /data/raw --output /data/interactions
  in_image data "$RUN_UID" vaecf split --input /data/interactions --output /data/split
  [ "$(stat -c %u "$CHECK_DIR/data/split")" = "${RUN_UID%%:*}" ] || fail "split not owned by $RUN_UID"
  local out err
  out=$(in_image data "$RUN_UID" vaecf --help)
  grep -q '^  split ' <<< "$out" || fail "data image's help lacks split"
  ! grep -qE '^  (train|report|launch-mpijob) ' <<< "$out" || fail "data image lists stages it cannot run: $out"
  # buildah adds its own lines to stderr; the stage's own stderr is taken from stdout.
  err=$(in_image data "$RUN_UID" sh -c 'vaecf train --help 2>&1' 2>/dev/null) \
    && fail "train ran in the data image"
  [ "$(wc -l <<< "$err")" = 1 ] && grep -q 'vaecf-train' <<< "$err" \
    || fail "train in the data image should fail with one line naming vaecf-train: $err"
  in_image data "$RUN_UID" sh -c 'test ! -e /build && ! pip list 2>/dev/null | grep -qiE "^(tensorflow|keras|kfp) "' \
    || fail "data image holds build files or TensorFlow"
}

check_launcher() {
  say "launcher as uid $RUN_UID"
  in_image launcher "$RUN_UID" vaecf launch-mpijob --help > /dev/null
  in_image launcher "$RUN_UID" sh -c 'test -f "$VAECF_INFERENCESERVICE_TEMPLATE"' \
    || fail "launcher lacks the InferenceService template of vaecf deploy"
  local err
  err=$(in_image launcher "$RUN_UID" python -c 'import matplotlib.pyplot' 2>&1)
  [ -z "$err" ] || fail "matplotlib under uid $RUN_UID: $err"
}

# check_horovod IMAGE PART...: `horovodrun --check-build` in IMAGE lists each PART as built.
check_horovod() {
  local image=$1 build part
  shift
  say "$image: horovodrun --check-build"
  build=$(in_image "$image" 1000:1000 horovodrun --check-build)
  echo "$build"
  for part in "$@"; do
    grep -q "\[X\] $part" <<< "$build" || fail "horovod in vaecf-$image lacks $part"
  done
}

check_train() {
  check_horovod train-cpu TensorFlow MPI Gloo
  say "train-cpu: horovodrun -np 2 vaecf train (MPI) as uid $RUN_UID"
  in_image train-cpu "$RUN_UID" horovodrun -np 2 --mpi vaecf train --split /data/split \
    --output /data/model --epochs 2 --batch-size 64 --hidden 32 --latent 8 \
    --expect-world-size 2
  [ -n "$(ls -A "$CHECK_DIR/data/model")" ] || fail "train wrote no model"
}

# The server and its clients run inside the serve image, on its loopback (chroot isolation
# shares the host's network namespace; the clients use 127.0.0.1 only).
check_serve() {
  say "serve as uid $RUN_UID: one v1 and one v2 request, then SIGTERM"
  local out
  out=$(in_image serve "$RUN_UID" python -c '
import json, pathlib
from vaecf.serve.loadtest import ServerProcess, request
server = ServerProcess("/data/model")
server.start(pathlib.Path("/tmp/serve.log"))
json_type = {"Content-Type": "application/json"}
v1 = request(server.url, "POST", "/v1/models/vaecf:predict",
             json.dumps({"instances": [{"items": [], "k": 5}]}).encode(), json_type)
v2 = request(server.url, "POST", "/v2/models/vaecf/infer", json.dumps({"inputs": [
    {"name": "items", "datatype": "BYTES", "shape": [1, 1], "data": ["no-such-item"]},
    {"name": "k", "datatype": "INT32", "shape": [1], "data": [5]}]}).encode(), json_type)
code = server.stop()
assert v1[0] == 200 and len(json.loads(v1[1])["predictions"][0]["item_id"]) == 5, v1
outputs = {o["name"]: o for o in json.loads(v2[1])["outputs"]} if v2[0] == 200 else v2
assert outputs["item_id"]["shape"] == [1, 5] and outputs["fallback"]["data"] == [True], v2
assert code == 0, f"exit status {code} after SIGTERM: {server.log_tail()}"
print("serve ok")
') || fail "vaecf serve in vaecf-serve: $out"
  grep -q '^serve ok$' <<< "$out" || fail "vaecf serve in vaecf-serve: $out"
}

# The GPU flavour without a GPU: Horovod's CUDA build (NCCL) loads next to TensorFlow with
# every symbol bound (the check-build's TensorFlow line imports it), links the NCCL wheel and
# nothing the image lacks (TensorFlow's own libraries are found by Python, not ldd), `vaecf
# train` starts, and the CUDA compiler of the build stage stayed there (no nvcc, CUDA home or
# NVIDIA apt source in the image).
check_train_gpu() {
  check_horovod train TensorFlow MPI Gloo NCCL
  say "train: linked libraries, vaecf train --help, no build leftovers, as uid $RUN_UID"
  local libs
  libs=$(in_image train "$RUN_UID" sh -c 'ldd /opt/venv/lib/python3.11/site-packages/horovod/tensorflow/mpi_lib*.so')
  grep -q "libnccl.so.2 => /opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib/" <<< "$libs" \
    || fail "horovod in vaecf-train does not link the NCCL wheel: $libs"
  ! grep 'not found' <<< "$libs" | grep -v 'libtensorflow_' \
    || fail "horovod in vaecf-train links a library the image lacks"
  in_image train "$RUN_UID" vaecf train --help > /dev/null
  in_image train "$RUN_UID" sh -c '! command -v nvcc && test ! -e /opt/cuda && test ! -e /build \
      && test ! -e /wheels && ! grep -rqi nvidia /etc/apt/' \
    || fail "vaecf-train holds nvcc, the CUDA home, build files or an NVIDIA apt source"
}

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

main() {
  [ "$(id -u)" = 0 ] || fail "run as root (buildah storage, debootstrap, chown)"
  if [ $# -gt 0 ]; then want "$@"; else WANTED=("${IMAGES[@]}"); fi
  install_prerequisites
  pick_storage_driver
  mkdir -p "$CHECK_DIR"
  say "storage driver $STORAGE_DRIVER; images ${WANTED[*]}"
  trap cleanup EXIT
  remove_images "${IMAGES[@]}"  # left by an interrupted run
  stand_in_base
  start_disk_sampler
  # Two phases, so that the disk holds the GPU image alone, not every image at once. First the
  # CPU train image (its Horovod compile is CPU-bound) beside the data, launcher, serve and Spark
  # images (mostly downloads), all checked (in this order: each check may use the output of one
  # before it), then removed.
  local image train= began phase1=()
  for image in data launcher train-cpu serve spark; do
    if wanted "$image"; then phase1+=("$image"); fi
  done
  if wanted train-cpu; then
    build train-cpu docker/train.Dockerfile --build-arg FLAVOUR=cpu &
    train=$!
  fi
  for image in data launcher serve spark; do
    if wanted "$image"; then build "$image" "docker/$image.Dockerfile"; fi
  done
  if [ -n "$train" ]; then wait "$train" || fail "train-cpu build"; fi
  if [ ${#phase1[@]} -gt 0 ]; then
    buildah images --filter "reference=vaecf-*:$TAG"
    open_containers "${phase1[@]}"
    for image in "${phase1[@]}"; do
      began=$SECONDS
      "${CHECKS[$image]}"
      say "checked vaecf-$image in $((SECONDS - began)) s"
    done
    remove_images "${phase1[@]}"
  fi
  # Then the GPU train image, the largest, alone.
  if wanted train; then
    build train docker/train.Dockerfile
    buildah images --filter "reference=vaecf-train:$TAG"
    open_containers train
    check_train_gpu
    remove_images train
  fi
  say "images ${WANTED[*]} built and ran; peak disk use $(peak_disk) above the start"
}

main "$@"
