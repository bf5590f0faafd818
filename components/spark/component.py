"""Preprocess and split with engine=spark: ``vaecf launch-sparkapp`` runs the stage as a
SparkApplication and publishes its output as this step's artifact, the same artifact the
pandas step writes (the next steps read either).

The step's own pod only launches and watches (CPU); the Spark driver and executors are the
application's pods, sized by the ``executors``/``executor_*``/``driver_*`` flags.
"""

from kfp import dsl
from kfp.dsl import Dataset, Input, Output

from components.images import DEFAULT


def launch_args(stage: str, run_id: str, spark_image: str, s3_bucket: str, s3_prefix: str,
                protocol: str, executors: str, executor_cores: str, executor_memory: str,
                driver_memory: str, s3_secret: str, timeout_seconds: int) -> list:
    """The flags both Spark steps give ``vaecf launch-sparkapp`` (after input and output)."""
    return ["--stage", stage,
            "--store", dsl.ConcatPlaceholder(["s3://", s3_bucket, "/", s3_prefix]),
            "--run-id", run_id, "--image", spark_image, "--protocol", protocol,
            "--executors", executors, "--executor-cores", executor_cores,
            "--executor-memory", executor_memory, "--driver-memory", driver_memory,
            "--secret-name", s3_secret, "--timeout", timeout_seconds]


@dsl.container_component
def spark_preprocess(raw: Input[Dataset], interactions: Output[Dataset], run_id: str,
                     spark_image: str, s3_bucket: str, s3_prefix: str,
                     protocol: str = "mission", executors: str = "2",
                     executor_cores: str = "2", executor_memory: str = "4g",
                     driver_memory: str = "4g", s3_secret: str = "vaecf-s3",
                     timeout_seconds: int = 86400) -> dsl.ContainerSpec:
    """``vaecf preprocess --engine spark`` as a SparkApplication.

    Args:
      raw: output of ``download``; staged to ``s3://<bucket>/<prefix>/<app>/input``.
      interactions: ``interactions.parquet`` and its manifest, as ``preprocess`` writes them.
      run_id: the pipeline run's id; the application's name is derived from it, so a retried
        step attaches to the application its first attempt created.
      spark_image: image of the application's driver and executors (``vaecf-spark``).
      s3_bucket, s3_prefix: where the application reads its input and writes its output.
      executors, executor_cores, executor_memory, driver_memory: the application's size
        (integers and JVM sizes such as ``4g`` as text; `vaecf launch-sparkapp` checks them).
      s3_secret: Secret with the S3 credentials, passed to the driver by reference.
      timeout_seconds: the application is deleted and the step fails after this long.
    """
    return dsl.ContainerSpec(
        image=DEFAULT.launcher,
        command=["vaecf", "launch-sparkapp"],
        args=["--input", raw.path, "--output", interactions.path,
              *launch_args("preprocess", run_id, spark_image, s3_bucket, s3_prefix, protocol,
                           executors, executor_cores, executor_memory, driver_memory,
                           s3_secret, timeout_seconds)],
    )


@dsl.container_component
def spark_split(interactions: Input[Dataset], split: Output[Dataset], run_id: str,
                spark_image: str, s3_bucket: str, s3_prefix: str, seed: str = "98765",
                protocol: str = "mission", executors: str = "2", executor_cores: str = "2",
                executor_memory: str = "4g", driver_memory: str = "4g",
                s3_secret: str = "vaecf-s3", timeout_seconds: int = 86400
                ) -> dsl.ContainerSpec:
    """``vaecf split --engine spark`` as a SparkApplication (arguments as
    ``spark_preprocess``'s; ``seed`` is the split's)."""
    return dsl.ContainerSpec(
        image=DEFAULT.launcher,
        command=["vaecf", "launch-sparkapp"],
        args=["--input", interactions.path, "--output", split.path, "--seed", seed,
              *launch_args("split", run_id, spark_image, s3_bucket, s3_prefix, protocol,
                           executors, executor_cores, executor_memory, driver_memory,
                           s3_secret, timeout_seconds)],
    )
