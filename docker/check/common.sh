# shellcheck shell=bash
# The shared part of docker/check-images.sh (sourced by it; see its header): settings, logging,
# the prerequisites, the stand-in base, building, the images' working containers, the disk
# sampler and running a command in an image. Each image's checks are in docker/check/<image>.sh.

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
declare -A CONTAINERS=()
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
