# syntax=docker/dockerfile:1
# The data stages' image: `vaecf download | preprocess | split` (and nothing that needs
# TensorFlow). Build from the repository root:
#   docker build -f docker/data.Dockerfile -t vaecf-data:0.1.0 .
# Run a stage alone (data lives in a mounted directory or in object storage, never in the image);
# run as your own uid so that the stage can write the mounted directory (any uid works):
#   docker run --rm --user "$(id -u):$(id -g)" -v "$PWD/data:/data" vaecf-data:0.1.0 \
#     download --dataset synthetic --output /data/raw
#   docker run --rm --user "$(id -u):$(id -g)" -v "$PWD/data:/data" vaecf-data:0.1.0 \
#     preprocess --input /data/raw --output /data/interactions
# `vaecf --help` lists only the stages this image runs (no TensorFlow, no matplotlib).
#
# The base is pinned by tag. For byte-reproducible builds also pin its digest, e.g.
#   FROM python:3.11.11-slim-bookworm@sha256:<digest>
# with the digest from `docker buildx imagetools inspect python:3.11.11-slim-bookworm`
# (not done here: no registry access where this file was written).
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY requirements.lock pyproject.toml README.md /build/
COPY src /build/src

# Exact pins come from the one lock file, but only the data stages' dependencies and theirs:
# TensorFlow, kfp and Horovod are gigabytes this image never imports. `pip check` fails the
# build if the selection misses a dependency.
RUN grep -E '^(numpy|pandas|pyarrow|scipy|boto3|botocore|s3transfer|jmespath|python-dateutil|six|urllib3|pytz|tzdata)==' \
        /build/requirements.lock > /tmp/data.lock \
 && pip install --no-deps -r /tmp/data.lock \
 && pip install --no-deps /build \
 && pip check \
 && rm -rf /build /tmp/data.lock

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin vaecf
USER 10001:10001
WORKDIR /home/vaecf

ENTRYPOINT ["vaecf"]
CMD ["--help"]
