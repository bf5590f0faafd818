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
# comes from the node (NVIDIA container toolkit). Only Horovod's build stage adds nvcc and the
# static CUDA runtime, from NVIDIA's Debian 12 repository; Horovod links the NCCL wheel.
# OpenMPI is Debian 12's 4.1 (4.1.4), not 5: mpi-operator's hostfile settings are ignored by 5.
# Pin the base by digest for byte-reproducible builds (`docker buildx imagetools inspect`).
ARG BASE=python:3.11.11-slim-bookworm

FROM ${BASE} AS build
ARG FLAVOUR=gpu
ARG CUDA_REPO=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN test "$FLAVOUR" = gpu || test "$FLAVOUR" = cpu || { echo "FLAVOUR must be gpu or cpu"; exit 1; }
RUN apt-get update && apt-get install -y --no-install-recommends g++ make cmake libopenmpi-dev \
 && if [ "$FLAVOUR" = gpu ]; then \
      python -c "import urllib.request as u; u.urlretrieve('$CUDA_REPO/cuda-keyring_1.1-1_all.deb', '/tmp/keyring.deb')" \
      && dpkg -i /tmp/keyring.deb && apt-get update \
      && apt-get install -y --no-install-recommends cuda-nvcc-12-3 cuda-cudart-dev-12-3; \
    fi \
 && rm -rf /var/lib/apt/lists/*
COPY requirements.lock /tmp/
# The lock pins tensorflow-cpu; the GPU flavour installs the same version with its CUDA wheels.
RUN python -m venv /opt/venv \
 && pip install "pip<25" setuptools wheel \
 && if [ "$FLAVOUR" = gpu ]; then tf="tensorflow[and-cuda]==2.17.1"; else tf="tensorflow-cpu==2.17.1"; fi \
 && pip install -c /tmp/requirements.lock "$tf"
# Horovod is built against the installed TensorFlow with the system cmake (PyPI's cmake 4.x
# breaks Horovod's bundled gloo); only its wheel goes to the final image.
RUN if [ "$FLAVOUR" = gpu ]; then \
      nccl=$(python -c "import nvidia.nccl as m; print(m.__path__[0])") \
      && ln -sf libnccl.so.2 "$nccl/lib/libnccl.so" \
      && export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME="$nccl" HOROVOD_NCCL_LINK=SHARED \
         HOROVOD_CUDA_HOME=/usr/local/cuda-12.3; \
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
