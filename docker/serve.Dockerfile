# syntax=docker/dockerfile:1
# The KServe predictor: `vaecf serve` (v1 and v2 REST on 8080, v2 gRPC on 8081), the
# container of manifests/serving/inferenceservice.yaml. TensorFlow (CPU) and KServe, no
# Horovod, MPI or kfp. Build from the repository root:
#   docker build -f docker/serve.Dockerfile -t vaecf-serve:0.1.0 .
#   docker run --rm -p 8080:8080 -v "$PWD/data/model:/mnt/models:ro" vaecf-serve:0.1.0 \
#     serve --model /mnt/models
# It runs under any uid; nothing is written but /tmp (Keras' cache included).
#
# The base is pinned by tag; pin its digest too for byte-reproducible builds
# (`docker buildx imagetools inspect python:3.11.11-slim-bookworm`).
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KERAS_HOME=/tmp/keras

COPY requirements.lock pyproject.toml README.md /build/
COPY src /build/src

# Exact pins from the one lock file, limited to what `vaecf serve` imports (tensorflow-cpu,
# kserve, vaecf's own dependencies) and their dependencies; `pip check` fails the build if the
# selection misses one.
RUN grep -E '^(Markdown|MarkupSafe|PyYAML|Pygments|Werkzeug|absl-py|annotated-types|anyio|astunparse|boto3|botocore|certifi|cffi|charset-normalizer|click|cloudevents|cryptography|deprecation|fastapi|flatbuffers|gast|google-auth|google-pasta|grpc-interceptor|grpcio|h11|h5py|httpcore|httptools|httpx|idna|jmespath|keras|kserve|kubernetes|libclang|markdown-it-py|mdurl|ml-dtypes|namex|numpy|oauthlib|opt_einsum|optree|orjson|packaging|pandas|prometheus_client|protobuf|psutil|pyarrow|pyasn1|pyasn1_modules|pycparser|pydantic|pydantic_core|python-dateutil|python-dotenv|pytz|requests|requests-oauthlib|rich|s3transfer|scipy|six|sniffio|starlette|tabulate|tensorboard|tensorboard-data-server|tensorflow-cpu|tensorflow-io-gcs-filesystem|termcolor|timing-asgi|typing-inspection|typing_extensions|tzdata|urllib3|uvicorn|uvloop|watchfiles|websocket-client|websockets|wrapt)==' \
        /build/requirements.lock > /tmp/serve.lock \
 && pip install --no-deps -r /tmp/serve.lock \
 && pip install --no-deps /build \
 && pip check \
 && rm -rf /build /tmp/serve.lock

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin vaecf
USER 10001:10001
WORKDIR /home/vaecf
EXPOSE 8080 8081

ENTRYPOINT ["vaecf"]
CMD ["serve", "--help"]
