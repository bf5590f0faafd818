# syntax=docker/dockerfile:1
# The training image: `vaecf train` under mpirun in the MPIJob (launcher and workers), and
# `vaecf evaluate` on a GPU. TensorFlow 2.17 was built against CUDA 12.3 and cuDNN 8.9, so the
# base is CUDA 12.3 and cuDNN 8.9 comes with `tensorflow[and-cuda]`. OpenMPI is 4.1 (Ubuntu
# 22.04's), not 5: mpi-operator's hostfile settings are ignored by OpenMPI 5. Horovod 0.28.1
# is built with MPI, Gloo, TensorFlow and NCCL in a build stage; only its wheel is kept.
# Build from the repository root (needs no GPU):
#   docker build -f docker/train.Dockerfile -t vaecf-train:0.1.0 .
# Pin the bases by digest for byte-reproducible builds (`docker buildx imagetools inspect`).
ARG CUDA=12.3.2
ARG UBUNTU=ubuntu22.04
ARG NCCL=2.19.3-1+cuda12.3

FROM nvidia/cuda:${CUDA}-devel-${UBUNTU} AS build
ARG NCCL
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3.11 python3.11-dev python3.11-venv g++ make cmake git \
        openmpi-bin libopenmpi-dev libnccl2=${NCCL} libnccl-dev=${NCCL} \
 && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY requirements.lock /tmp/
# The lock pins tensorflow-cpu; the GPU build of the same version brings its CUDA libraries.
RUN pip install "pip<25" setuptools wheel \
 && pip install -c /tmp/requirements.lock "tensorflow[and-cuda]==2.17.1"
RUN HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_TENSORFLOW=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED HOROVOD_CUDA_HOME=/usr/local/cuda \
    MAKEFLAGS=-j4 \
    pip wheel --no-build-isolation --no-deps -w /wheels horovod==0.28.1

FROM nvidia/cuda:${CUDA}-runtime-${UBUNTU}
ARG NCCL
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH \
    TF_CPP_MIN_LOG_LEVEL=1
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv openmpi-bin libnccl2=${NCCL} openssh-server openssh-client \
 && rm -rf /var/lib/apt/lists/*

# mpi-operator's non-root layout: user mpiuser (uid 1000, as in manifests/base/mpijob.yaml),
# keys mounted by the operator at /home/mpiuser/.ssh (sshAuthMountPath), sshd on port 2222
# with a pid file and host key the user owns, and the client told to use that port.
RUN useradd --create-home --uid 1000 --shell /bin/bash mpiuser \
 && printf '%s\n' 'PidFile /home/mpiuser/sshd.pid' 'HostKey /home/mpiuser/.ssh/id_rsa' \
        'StrictModes no' 'Port 2222' > /home/mpiuser/.sshd_config \
 && printf '%s\n' 'Host *' '    Port 2222' '    StrictHostKeyChecking no' \
        '    UserKnownHostsFile /dev/null' '    LogLevel ERROR' >> /etc/ssh/ssh_config \
 && chown mpiuser:mpiuser /home/mpiuser/.sshd_config

COPY --from=build /opt/venv /opt/venv
COPY --from=build /wheels /wheels
COPY requirements.lock pyproject.toml README.md /build/
COPY src /build/src
RUN pip install --no-deps /wheels/horovod-*.whl \
 && pip install -c /build/requirements.lock /build \
 && for part in TensorFlow MPI Gloo NCCL; do \
      horovodrun --check-build | grep -q "\[X\] $part" || { echo "horovod lacks $part"; exit 1; }; \
    done \
 && rm -rf /build /wheels

USER 1000:1000
WORKDIR /home/mpiuser
ENTRYPOINT ["vaecf"]
CMD ["train", "--help"]
