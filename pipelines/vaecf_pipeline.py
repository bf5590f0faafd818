"""The vaecf pipeline: download -> preprocess -> split -> train (MPIJob) -> evaluate -> report,
and, with ``serve=true``, deploy (a KServe InferenceService serving the model). With
``engine=spark`` preprocess and split run as SparkApplications (``vaecf launch-sparkapp``).

Compile it with ``make pipeline`` (or ``python -m pipelines.vaecf_pipeline --output FILE``),
then ``kfp run create -e vaecf -r my-run -f build/vaecf_pipeline.yaml dataset=ml-20m ...``.
Names that differ per run (the MPIJob's) are derived from the run id inside the running step,
so the compiled file holds no timestamp, uuid or namespace.
"""

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from kfp import compiler, dsl, kubernetes

from components.deploy import deploy
from components.download import download
from components.evaluate import evaluate
from components.images import DEFAULT, DEFAULT_REGISTRY, DEFAULT_TAG, Images, load_digests
from components.preprocess import preprocess
from components.report import report
from components.spark import spark_preprocess, spark_split
from components.split import split
from components.train import train

GPU_RESOURCE = "nvidia.com/gpu"
GPU_NODE_LABEL = ("nvidia.com/gpu.present", "true")  # set by NVIDIA's GPU operator
S3_ENV = {name: name for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                  "AWS_ENDPOINT_URL")}


def use_gpus(task: dsl.PipelineTask, count: int) -> dsl.PipelineTask:
    """Run ``task`` on ``count`` NVIDIA GPUs, on a GPU node, tolerating its taint."""
    task.set_accelerator_type(GPU_RESOURCE).set_accelerator_limit(count)
    kubernetes.add_toleration(task, key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")
    return kubernetes.add_node_selector(task, *GPU_NODE_LABEL)


def use_s3_credentials(task: dsl.PipelineTask, secret: Any) -> dsl.PipelineTask:
    """S3 credentials as environment variables from a Secret, by reference (never values)."""
    return kubernetes.use_secret_as_env(task, secret_name=secret, secret_key_to_env=S3_ENV)


def retry_io(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """Retry a step whose failures are mostly transient (network, object storage, API)."""
    return task.set_retry(num_retries=3, backoff_duration="60s", backoff_factor=2.0)


def download_step(images: Images, dataset: Any, source: Any, seed: Any, s3_secret: Any,
                  columns: dict[str, Any]) -> dsl.PipelineTask:
    """The download task every vaecf pipeline starts with.

    Args:
      columns: ``user_column``, ``item_column``, ``value_column``, ``value_kind``: the
        pipeline parameters naming a ``table`` dataset's columns (unset for the others).
    """
    fetched = download(dataset=dataset, source=source, seed=seed, **columns)
    fetched.set_container_image(images.data)
    return retry_io(use_s3_credentials(fetched, s3_secret))  # --source may be s3://


def pandas_steps(images: Images, raw: Any, protocol: Any, seed: Any,
                 engine: Any = "pandas") -> dsl.PipelineTask:
    """preprocess -> split in the data image (the pandas engine); the split task.

    ``engine`` reaches both stages' ``--engine``: a value other than ``pandas`` or ``spark``
    stops preprocess with one line."""
    filtered = preprocess(raw=raw, protocol=protocol, engine=engine)
    filtered.set_container_image(images.data)

    splitted = split(interactions=filtered.outputs["interactions"], seed=seed, protocol=protocol,
                     engine=engine)
    return splitted.set_container_image(images.data)


def spark_steps(images: Images, raw: Any, protocol: Any, seed: Any, s3_secret: Any,
                store: dict[str, Any], size: dict[str, Any]) -> dsl.PipelineTask:
    """preprocess -> split as SparkApplications (``vaecf launch-sparkapp``); the split task.

    Args:
      store: ``s3_bucket``, ``s3_prefix``: where the applications read and write.
      size: ``spark_image``, ``executors``, ``executor_cores``, ``executor_memory``,
        ``driver_memory``: the applications' image and size.
    """
    common = dict(run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, protocol=protocol,
                  s3_secret=s3_secret, **store, **size)
    filtered = spark_preprocess(raw=raw, **common)
    retry_io(use_s3_credentials(filtered.set_container_image(images.launcher), s3_secret))

    splitted = spark_split(interactions=filtered.outputs["interactions"], seed=seed, **common)
    return retry_io(use_s3_credentials(splitted.set_container_image(images.launcher),
                                       s3_secret))  # re-attach to their own applications


def data_steps(images: Images, dataset: Any, source: Any, protocol: Any, seed: Any,
               s3_secret: Any, columns: dict[str, Any]) -> dsl.PipelineTask:
    """download -> preprocess -> split (pandas engine); the split task."""
    fetched = download_step(images, dataset, source, seed, s3_secret, columns)
    return pandas_steps(images, fetched.outputs["raw"], protocol, seed)


def build_pipeline(images: Images = DEFAULT) -> Callable[..., Any]:
    """The pipeline with its images fixed (registry and tag, or digests)."""

    @dsl.pipeline(name="vaecf", description="Mult-VAE collaborative filtering: data, "
                  "Horovod training as an MPIJob, GPU evaluation, a benchmark report and "
                  "optional serving on KServe.")
    # Every parameter is a string: `kfp run submit key=value` sends strings, and the backend
    # refuses a string for an integer parameter (kubeflow/pipelines#11607). The stage CLIs
    # parse and check the numbers (`--epochs 1OO` fails that step with one line).
    def vaecf(dataset: str = "synthetic",
              source: Optional[str] = None,  # noqa: UP045 (kfp needs typing.Optional)
              user_column: Optional[str] = None,  # noqa: UP045
              item_column: Optional[str] = None,  # noqa: UP045
              value_column: Optional[str] = None,  # noqa: UP045
              value_kind: Optional[str] = None,  # noqa: UP045
              protocol: str = "mission", seed: str = "98765", epochs: str = "0",
              patience: str = "40", max_epochs: str = "200",
              batch_per_rank: str = "1024", lr_scaling: str = "sqrt",
              precision: str = "mixed_bfloat16", xla: str = "true", workers: str = "2",
              gpus_per_worker: str = "1", compression: str = "none",
              nccl_debug: str = "WARN", s3_bucket: str = "vaecf", s3_prefix: str = "runs",
              s3_secret: str = "vaecf-s3", train_image: str = images.train,
              serve: str = "false", serve_image: str = images.serve,
              engine: str = "pandas", spark_image: str = images.ref("spark"),
              spark_executors: str = "2", spark_executor_cores: str = "2",
              spark_executor_memory: str = "4g", spark_driver_memory: str = "4g") -> None:
        columns = {"user_column": user_column, "item_column": item_column,
                   "value_column": value_column, "value_kind": value_kind}
        fetched = download_step(images, dataset, source, seed, s3_secret, columns)
        raw = fetched.outputs["raw"]
        # engine=spark: preprocess and split run as SparkApplications; either branch
        # publishes the same split artifact, which every later step reads.
        with dsl.If(engine == "spark", name="spark"):
            on_spark = spark_steps(
                images, raw, protocol, seed, s3_secret,
                store={"s3_bucket": s3_bucket, "s3_prefix": s3_prefix},
                size={"spark_image": spark_image, "executors": spark_executors,
                      "executor_cores": spark_executor_cores,
                      "executor_memory": spark_executor_memory,
                      "driver_memory": spark_driver_memory})
        with dsl.Else(name="pandas"):
            on_pandas = pandas_steps(images, raw, protocol, seed, engine)
        split_data = dsl.OneOf(on_spark.outputs["split"], on_pandas.outputs["split"])

        trained = train(split=split_data,
                        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, train_image=train_image,
                        s3_bucket=s3_bucket, s3_prefix=s3_prefix, workers=workers,
                        gpus_per_worker=gpus_per_worker, epochs=epochs,
                        patience=patience, max_epochs=max_epochs,
                        batch_per_rank=batch_per_rank, lr_scaling=lr_scaling,
                        precision=precision, xla=xla, seed=seed, compression=compression,
                        nccl_debug=nccl_debug, s3_secret=s3_secret)
        trained.set_container_image(images.launcher).set_caching_options(False)
        retry_io(use_s3_credentials(trained, s3_secret))  # re-attaches to its own MPIJob

        evaluated = evaluate(split=split_data, model=trained.outputs["model"])
        use_gpus(evaluated.set_container_image(images.train), 1)

        reported = report(split=split_data, model=trained.outputs["model"],
                          evaluation=evaluated.outputs["evaluation"])
        reported.set_container_image(images.launcher)

        with dsl.If(serve == "true", name="serve"):
            deployed = deploy(model=trained.outputs["model"],
                              run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, s3_bucket=s3_bucket,
                              s3_prefix=s3_prefix, serve_image=serve_image)
            deployed.set_container_image(images.launcher).set_caching_options(False)
            deployed.after(evaluated)  # serve only a model whose evaluation succeeded
            retry_io(use_s3_credentials(deployed, s3_secret))  # reads the model in S3

    return vaecf


def compile_pipeline(output: Path, images: Images = DEFAULT) -> Path:
    output.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline(images), str(output))
    return output


def compile_parser(prog: str, description: str, output: str) -> argparse.ArgumentParser:
    """The flags every compile command shares: the YAML path and the images' names."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--output", type=Path, default=Path(output))
    parser.add_argument("--registry", default=DEFAULT_REGISTRY)
    parser.add_argument("--tag", default=DEFAULT_TAG)
    parser.add_argument("--digests", type=Path,
                        help="JSON of image digests (make push); pins images by digest")
    return parser


def images_of(args: argparse.Namespace) -> Images:
    """The images ``compile_parser``'s flags name."""
    return Images(args.registry, args.tag, load_digests(args.digests) if args.digests else {})


def main(argv: list[str] | None = None) -> int:
    args = compile_parser("python -m pipelines.vaecf_pipeline",
                          "Compile the vaecf pipeline to YAML.",
                          "build/vaecf_pipeline.yaml").parse_args(argv)
    path = compile_pipeline(args.output, images_of(args))
    print(f"compiled {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
