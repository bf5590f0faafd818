# syntax=docker/dockerfile:1
# The pipeline's tool image: the train step (`vaecf launch-mpijob`: creates and watches the
# MPIJob, copies the model out of object storage), the Spark steps (`vaecf launch-sparkapp`),
# the report step (`python -m vaecf.stages.kfp_report`) and the optional serve step (`vaecf
# deploy`). No TensorFlow: the training runs in the MPIJob's pods.
# Build from the repository root:
#   docker build -f docker/launcher.Dockerfile -t vaecf-launcher:0.1.0 .
# It runs under any uid (`docker run --user "$(id -u):$(id -g)"`): matplotlib's cache goes to
# MPLCONFIGDIR under /tmp, not to the home a foreign uid may not have.
#
# The base is pinned by tag; pin its digest too for byte-reproducible builds
# (`docker buildx imagetools inspect python:3.11.11-slim-bookworm`).
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VAECF_MPIJOB_TEMPLATE=/opt/vaecf/manifests/mpijob.yaml \
    VAECF_INFERENCESERVICE_TEMPLATE=/opt/vaecf/manifests/inferenceservice.yaml \
    VAECF_SPARKAPP_TEMPLATE=/opt/vaecf/manifests/sparkapplication.yaml \
    MPLCONFIGDIR=/tmp/matplotlib

COPY requirements.lock pyproject.toml README.md /build/
COPY src /build/src

# Exact pins from the one lock file, limited to what these two steps import (the kubernetes
# client, boto3, matplotlib for the report's plots, vaecf's own dependencies) and their
# dependencies; `pip check` fails the build if the selection misses one.
RUN grep -E '^(kubernetes|PyYAML|google-auth|pyasn1|pyasn1_modules|cryptography|cffi|pycparser|oauthlib|requests|requests-oauthlib|charset-normalizer|idna|certifi|websocket-client|boto3|botocore|s3transfer|jmespath|python-dateutil|six|urllib3|numpy|pandas|pytz|tzdata|pyarrow|scipy|matplotlib|contourpy|cycler|fonttools|kiwisolver|packaging|pillow|pyparsing)==' \
        /build/requirements.lock > /tmp/launcher.lock \
 && pip install --no-deps -r /tmp/launcher.lock \
 && pip install --no-deps /build \
 && pip check \
 && rm -rf /build /tmp/launcher.lock

# The MPIJob template `vaecf launch-mpijob` renders (see manifests/base/mpijob.yaml).
COPY manifests/base/mpijob.yaml /opt/vaecf/manifests/mpijob.yaml
# The InferenceService template `vaecf deploy` renders (manifests/serving/).
COPY manifests/serving/inferenceservice.yaml /opt/vaecf/manifests/inferenceservice.yaml
# The SparkApplication template `vaecf launch-sparkapp` renders (manifests/spark/).
COPY manifests/spark/sparkapplication.yaml /opt/vaecf/manifests/sparkapplication.yaml

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin vaecf
USER 10001:10001
WORKDIR /home/vaecf

ENTRYPOINT ["vaecf"]
CMD ["launch-mpijob", "--help"]
