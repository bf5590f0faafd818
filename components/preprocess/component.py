"""``vaecf preprocess`` as a KFP container component: raw files in, interactions out."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Output

from components.images import DEFAULT


@dsl.container_component
def preprocess(raw: Input[Dataset], interactions: Output[Dataset],
               protocol: str = "mission", engine: str = "pandas") -> dsl.ContainerSpec:
    """Implicit positives filtered by the protocol's thresholds (DESIGN.md section 4).

    Args:
      raw: output of ``download``.
      interactions: ``interactions.parquet`` (user_id, item_id) and its manifest.
      protocol: ``mission`` or ``paper``.
      engine: ``pandas`` (the Spark engine runs as ``components.spark``'s SparkApplication).
    """
    return dsl.ContainerSpec(
        image=DEFAULT.data,
        command=["vaecf", "preprocess"],
        args=["--input", raw.path, "--output", interactions.path, "--protocol", protocol,
              "--engine", engine],
    )
