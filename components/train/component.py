"""The train step: ``vaecf launch-mpijob`` runs ``vaecf train`` as a Horovod MPIJob.

The step's own pod only launches and watches (CPU); the GPUs belong to the MPIJob's workers,
so GPU settings are the ``--workers``/``--gpus-per-worker`` flags, not this pod's resources.
"""

from kfp import dsl
from kfp.dsl import Dataset, Input, Model, Output

from components.images import DEFAULT


@dsl.container_component
def train(split: Input[Dataset], model: Output[Model], run_id: str, train_image: str,
          s3_bucket: str, s3_prefix: str, workers: str = "2", gpus_per_worker: str = "1",
          epochs: str = "0", patience: str = "40", max_epochs: str = "200",
          batch_per_rank: str = "1024", lr_scaling: str = "sqrt",
          precision: str = "mixed_bfloat16", xla: str = "true", seed: str = "98765",
          compression: str = "none",
          nccl_debug: str = "WARN", s3_secret: str = "vaecf-s3",
          timeout_seconds: int = 172800, hyperparameters: str = "{}"
          ) -> dsl.ContainerSpec:
    """Train Mult-VAE on ``workers`` x ``gpus_per_worker`` GPUs and publish the model.

    Args:
      split: output of ``split``; staged to ``s3://<bucket>/<prefix>/<job>/split``.
      model: the trained model directory (``saved_model/``, ``train_log.jsonl``, manifest).
      run_id: the pipeline run's id; the MPIJob's name is derived from it, so a retried
        step attaches to the job its first attempt created.
      train_image: image of the MPIJob's launcher and workers.
      s3_bucket: bucket the MPIJob's pods read the split from and write the model to.
      s3_prefix: key prefix inside ``s3_bucket``.
      s3_secret: Secret with the S3 credentials, passed to the MPIJob by reference.
      batch_per_rank: users per step on each rank (one rank per GPU); the global batch is
        this x workers x GPUs per worker.
      lr_scaling: how the learning rate follows the global batch (none, sqrt, linear).
      precision, xla: the step's precision and XLA compilation ("true" or "false"); the
        defaults were the fastest measured on one H100 (README, "Results").
      compression: gradient allreduce format, none or fp16 (for workers on several hosts).
      nccl_debug: NCCL_DEBUG of every rank (INFO names the transport NCCL chose).
      epochs: "0" (the default) trains until the validation NDCG@100 has not improved for
        ``patience`` epochs, at most ``max_epochs`` (``vaecf train`` without ``--epochs``);
        N > 0 trains exactly N epochs.
      workers, gpus_per_worker, epochs, patience, max_epochs, batch_per_rank, seed: decimal
        integers as text, so
        that `kfp run submit key=value` can set them; `vaecf launch-mpijob` parses and checks
        them.
      timeout_seconds: the job is deleted and the step fails after this long.
      hyperparameters: a tuning trial's settings as JSON (``{"beta_cap": 0.3, ...}``; keys
        of ``vaecf.tuning.space.SEARCHABLE``); ``epochs`` there replaces ``epochs``.
    """
    return dsl.ContainerSpec(
        image=DEFAULT.launcher,
        command=["vaecf", "launch-mpijob"],
        args=["--split", split.path, "--output", model.path,
              "--store", dsl.ConcatPlaceholder(["s3://", s3_bucket, "/", s3_prefix]),
              "--run-id", run_id, "--image", train_image,
              "--workers", workers, "--gpus-per-worker", gpus_per_worker,
              "--epochs", epochs, "--patience", patience, "--max-epochs", max_epochs,
              "--batch-per-rank", batch_per_rank,
              "--lr-scaling", lr_scaling, "--precision", precision, "--xla", xla,
              "--seed", seed,
              "--compression", compression, "--nccl-debug", nccl_debug,
              "--secret-name", s3_secret, "--timeout", timeout_seconds,
              "--hyperparameters", hyperparameters],
    )
