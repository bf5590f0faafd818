"""``vaecf evaluate`` as a KFP container component (runs on a GPU in the train image)."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Model, Output

from components.images import DEFAULT


@dsl.container_component
def evaluate(split: Input[Dataset], model: Input[Model], evaluation: Output[Artifact],
             subset: str = "test") -> dsl.ContainerSpec:
    """Recall@20, Recall@50 and NDCG@100 of the model, with popularity and EASE for context.

    Args:
      split: output of ``split``.
      model: output of ``train``.
      evaluation: directory with ``metrics.json`` and ``evaluate_manifest.json``.
      subset: held-out users to score: ``test`` or ``val``.
    """
    return dsl.ContainerSpec(
        image=DEFAULT.train,
        command=["vaecf", "evaluate"],
        args=["--split", split.path, "--model", model.path, "--output", evaluation.path,
              "--subset", subset, "--baselines", "popularity", "ease"],
    )
