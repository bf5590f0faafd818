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
# data's split). The shared part is docker/check/common.sh; each image's checks are in
# docker/check/<image>.sh (train.sh: both flavours of the train image).
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

# The shared part, then one file of checks per image.
for part in common data launcher train serve spark; do
  # shellcheck source=/dev/null
  source "docker/check/$part.sh"
done

# The images, what each one's check uses, and the first phase's checks (the GPU train image is
# checked alone in the second, by check_train_gpu).
IMAGES=(data launcher train-cpu serve spark train)
declare -A USES=([train-cpu]=data [serve]=train-cpu)  # the image whose output a check uses
declare -A CHECKS=([data]=check_data [launcher]=check_launcher [train-cpu]=check_train
                   [serve]=check_serve [spark]=check_spark)  # the first phase's checks

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
