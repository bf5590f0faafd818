"""The optional serve step: ``vaecf deploy`` points a KServe InferenceService at the model.

It runs in the launcher image (the Kubernetes client) with the Role of
``manifests/serving/rbac.yaml``; the predictor itself runs the serve image.
"""

from kfp import dsl
from kfp.dsl import Input, Model

from components.images import DEFAULT


@dsl.container_component
def deploy(model: Input[Model], run_id: str, s3_bucket: str, s3_prefix: str,
           serve_image: str, name: str = "vaecf") -> dsl.ContainerSpec:
    """Create or update the InferenceService ``name`` serving the train step's model.

    Args:
      model: output of ``train``; the step checks it is the model the MPIJob left at
        ``s3://<bucket>/<prefix>/<job>/model``, which KServe downloads.
      run_id: the pipeline run's id (names the train step's job, hence the model's prefix).
      serve_image: image of the predictor (``vaecf serve``).
      name: the InferenceService, also the model name in its endpoints.
    """
    return dsl.ContainerSpec(
        image=DEFAULT.launcher,
        command=["vaecf", "deploy"],
        args=["--model", model.path,
              "--store", dsl.ConcatPlaceholder(["s3://", s3_bucket, "/", s3_prefix]),
              "--run-id", run_id, "--image", serve_image, "--name", name],
    )
