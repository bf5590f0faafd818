# syntax=docker/dockerfile:1
# The training image: `vaecf train` under mpirun in the MPIJob (launcher and workers), and
# `vaecf evaluate`. Two flavours from one file, selected by the FLAVOUR build argument:
#   docker build -f docker/train.Dockerfile -t vaecf-train:0.1.0 .                          # GPU
#   docker build -f docker/train.Dockerfile --build-arg FLAVOUR=cpu -t vaecf-train-cpu:0.1.0 .
# (the CPU flavour is what manifests/overlays/cpu runs; building either needs no GPU).
#
# Both flavours stand on the data and launcher images' base, python:3.11.11-slim-bookworm, so
# all images share one Python and the CPU flavour checks the GPU flavour's MPI, sshd and
# Horovod layers. The GPU flavour takes CUDA 12.3, cuDNN 8.9 and NCCL 2.19 once, as the
# `tensorflow[and-cuda]==2.17.1` wheels TensorFlow pins (NVIDIA's CUDA 12.3 images ship cuDNN 9,
# which TensorFlow 2.17 cannot load, and an NCCL they hold at another version); the driver
# comes from the node (NVIDIA container toolkit). Only Horovod's build stage adds a CUDA
# compiler, from the two registries an air-gapped cluster mirrors anyway, never NVIDIA's own
# repository: PyPI's CUDA 12.4 wheels (ptxas, libdevice and the crt, runtime and CCCL headers)
# and, because no nvidia-cuda-nvcc-cu12 wheel carries the nvcc driver itself, the nvcc, cicc,
# cudafe++, fatbinary and nvlink binaries of the same 12.4.131 release from Debian's
# nvidia-cuda-toolkit package (trixie, non-free; unpacked, not installed). Horovod uses the
# CUDA runtime and NCCL of TensorFlow's wheels, with kernels for sm_80 (A100) and sm_90 (H100).
# OpenMPI is Debian 12's 4.1 (4.1.4), not 5: mpi-operator's hostfile settings are ignored by 5.
# Pin the base by digest for byte-reproducible builds (`docker buildx imagetools inspect`).
ARG BASE=python:3.11.11-slim-bookworm

FROM ${BASE} AS build
ARG FLAVOUR=gpu
# The GPU flavour's CUDA compiler (header above); each piece pinned to release 12.4.131.
ARG CUDA_WHEELS="nvidia-cuda-nvcc-cu12==12.4.131 nvidia-cuda-runtime-cu12==12.4.127 nvidia-cuda-cccl-cu12==12.4.127.post1"
ARG NVCC_DEB=nvidia-cuda-toolkit=12.4.131~12.4.1-2
ARG NVCC_APT_SOURCE="deb http://deb.debian.org/debian trixie non-free"
# Compute capabilities Horovod's kernels are compiled for (SASS for each, PTX for the last).
ARG CUDA_CC_LIST=80,90
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN test "$FLAVOUR" = gpu || test "$FLAVOUR" = cpu || { echo "FLAVOUR must be gpu or cpu"; exit 1; }
RUN apt-get update && apt-get install -y --no-install-recommends g++ make cmake libopenmpi-dev \
 && rm -rf /var/lib/apt/lists/*
COPY requirements.lock /tmp/
# The lock pins tensorflow-cpu; the GPU flavour installs the same version with its CUDA wheels.
RUN python -m venv /opt/venv \
 && pip install "pip<25" setuptools wheel \
 && if [ "$FLAVOUR" = gpu ]; then tf="tensorflow[and-cuda]==2.17.1"; else tf="tensorflow-cpu==2.17.1"; fi \
 && pip install -c /tmp/requirements.lock "$tf"
# /opt/cuda, the CUDA home Horovod's build asks for (HOROVOD_CUDA_HOME): bin/ (nvcc and its
# tools, with an nvcc.profile for this layout), nvvm/, include/, and lib64/ holding the
# libcudart.so.12 of TensorFlow's wheel for CMake's compiler checks. The nvcc package comes through a private apt state, so
# the build stage's own package lists stay bookworm's. CMake names libcudadevrt on every CUDA
# link line; Horovod's kernels use no device runtime (no -rdc), so an empty archive stands in.
RUN if [ "$FLAVOUR" = gpu ]; then \
      set -e; cuda=/opt/cuda; tmp=/tmp/cuda; \
      mkdir -p $tmp/apt/lists/partial $tmp/apt/cache/archives/partial $cuda/bin $cuda/nvvm/bin $cuda/lib64; \
      echo "$NVCC_APT_SOURCE" > $tmp/apt/sources.list; \
      apt="-o Dir::Etc::SourceList=$tmp/apt/sources.list -o Dir::Etc::SourceParts=/dev/null"; \
      apt="$apt -o Dir::State::Lists=$tmp/apt/lists -o Dir::Cache=$tmp/apt/cache"; \
      apt-get $apt update -qq; \
      (cd $tmp && apt-get $apt download "$NVCC_DEB"); \
      dpkg-deb -x $tmp/nvidia-cuda-toolkit_*.deb $tmp/deb; \
      cp -r $tmp/deb/usr/lib/nvidia-cuda-toolkit/bin/nvcc $tmp/deb/usr/lib/nvidia-cuda-toolkit/bin/crt $cuda/bin/; \
      cp $tmp/deb/usr/bin/cudafe++ $tmp/deb/usr/bin/fatbinary $tmp/deb/usr/bin/nvlink $tmp/deb/usr/bin/bin2c $cuda/bin/; \
      cp $tmp/deb/usr/lib/nvidia-cuda-toolkit/bin/cicc $cuda/nvvm/bin/; \
      pip install --no-deps --target $tmp/wheels $CUDA_WHEELS; \
      cp -r $tmp/wheels/nvidia/cuda_nvcc/bin $tmp/wheels/nvidia/cuda_nvcc/nvvm $tmp/wheels/nvidia/cuda_nvcc/include $cuda/; \
      cp -r $tmp/wheels/nvidia/cuda_runtime/include/. $tmp/wheels/nvidia/cuda_cccl/include/. $cuda/include/; \
      printf '%s\n' 'TOP = $(_HERE_)/..' 'NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice' \
        'PATH += $(TOP)/nvvm/bin:$(_HERE_):' 'INCLUDES += "-I$(TOP)/include" $(_SPACE_)' \
        'LIBRARIES =+ $(_SPACE_) "-L$(TOP)/lib64"' > $cuda/bin/nvcc.profile; \
      site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
      ln -s $site/nvidia/cuda_runtime/lib/libcudart.so.12 $cuda/lib64/libcudart.so; \
      ar rc $cuda/lib64/libcudadevrt.a; \
      echo 'set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)' > $cuda/shared-cudart.cmake; \
      rm -rf $tmp; $cuda/bin/nvcc --version; \
    fi
# Horovod is built against the installed TensorFlow with the system cmake (PyPI's cmake 4.x
# breaks Horovod's bundled gloo); only its wheel goes to the final image. GPU: CMake and nvcc
# are told to link the shared CUDA runtime (CMAKE_TOOLCHAIN_FILE, CUDAFLAGS; the wheels carry
# no static one), and Horovod's CUDA calls bind to the CUDA 12.3 runtime that TensorFlow's
# libtensorflow_framework.so.2 carries and exports (the linker then drops libcudart.so.12 as
# unneeded): one CUDA runtime per process. NCCL is the nvidia-nccl-cu12 wheel's.
RUN if [ "$FLAVOUR" = gpu ]; then \
      nccl=$(python -c "import nvidia.nccl as m; print(m.__path__[0])") \
      && ln -sf libnccl.so.2 "$nccl/lib/libnccl.so" \
      && export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME="$nccl" HOROVOD_NCCL_LINK=SHARED \
         HOROVOD_CUDA_HOME=/opt/cuda HOROVOD_BUILD_CUDA_CC_LIST="$CUDA_CC_LIST" \
         CMAKE_TOOLCHAIN_FILE=/opt/cuda/shared-cudart.cmake CUDAFLAGS=-cudart=shared; \
    fi \
 && HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_TENSORFLOW=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
    pip wheel --no-build-isolation --no-deps -w /wheels horovod==0.28.1

FROM ${BASE}
ARG FLAVOUR=gpu
# HOME: horovodrun (~/.horovod) and Keras (~/.keras) write there, and an arbitrary uid
# (`docker run --user`) has home / (ssh and sshd take mpiuser's keys from its passwd entry).
# LD_LIBRARY_PATH: Horovod finds the NCCL wheel's library (GPU flavour; absent in the CPU one).
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH \
    TF_CPP_MIN_LOG_LEVEL=1 HOME=/tmp \
    LD_LIBRARY_PATH=/opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib
# mpi-operator's non-root layout: user mpiuser (uid 1000, as in manifests/base/mpijob.yaml),
# keys mounted by the operator at /home/mpiuser/.ssh (sshAuthMountPath), sshd on port 2222
# with a pid file and host key the user owns, and the client told to use that port.
RUN apt-get update && apt-get install -y --no-install-recommends \
        openmpi-bin openssh-server openssh-client \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 1000 --shell /bin/bash mpiuser \
 && printf '%s\n' 'PidFile /home/mpiuser/sshd.pid' 'HostKey /home/mpiuser/.ssh/id_rsa' \
        'StrictModes no' 'Port 2222' > /home/mpiuser/.sshd_config \
 && printf '%s\n' 'Host *' '    Port 2222' '    StrictHostKeyChecking no' \
        '    UserKnownHostsFile /dev/null' '    LogLevel ERROR' >> /etc/ssh/ssh_config \
 && chown mpiuser:mpiuser /home/mpiuser/.sshd_config

COPY --from=build /opt/venv /opt/venv
COPY --from=build /wheels /wheels
COPY requirements.lock pyproject.toml README.md /build/
COPY src /build/src
# Horovod's own dependencies (PyYAML, cloudpickle, psutil, ...) come under the lock's pins;
# `pip check` fails the build on any missing or conflicting one.
RUN pip install -c /build/requirements.lock /wheels/horovod-*.whl /build \
 && pip check \
 && build=$(horovodrun --check-build) && echo "$build" \
 && parts="TensorFlow MPI Gloo" && if [ "$FLAVOUR" = gpu ]; then parts="$parts NCCL"; fi \
 && for part in $parts; do \
      echo "$build" | grep -q "\[X\] $part" || { echo "horovod lacks $part"; exit 1; }; \
    done \
 && rm -rf /build /wheels

USER 1000:1000
WORKDIR /home/mpiuser
ENTRYPOINT ["vaecf"]
CMD ["train", "--help"]
