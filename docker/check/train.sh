# shellcheck shell=bash
# vaecf-train, both flavours of docker/train.Dockerfile: the CPU one trains under horovodrun -np 2
# (MPI), the GPU one is checked without a GPU (sourced by docker/check-images.sh).

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
