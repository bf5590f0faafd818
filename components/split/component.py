"""``vaecf split`` as a KFP container component: interactions in, train/val/test out."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Output

from components.images import DEFAULT


@dsl.container_component
def split(interactions: Input[Dataset], split: Output[Dataset], seed: str = "98765",
          protocol: str = "mission", engine: str = "pandas") -> dsl.ContainerSpec:
    """Users into train/val/test, held-out users' items into fold_in/holdout.

    Args:
      interactions: output of ``preprocess``.
      split: the split directory (CSR matrices, Parquet, indexes, ``dataset_manifest.json``).
      seed: the split's only randomness, an integer as text (`vaecf split` parses it).
      protocol: ``mission`` (fractions) or ``paper`` (fixed held-out user counts).
      engine: ``pandas`` (the Spark engine runs as ``components.spark``'s SparkApplication).
    """
    return dsl.ContainerSpec(
        image=DEFAULT.data,
        command=["vaecf", "split"],
        args=["--input", interactions.path, "--output", split.path, "--seed", seed,
              "--protocol", protocol, "--engine", engine],
    )
