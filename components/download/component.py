"""``vaecf download`` as a KFP container component: dataset name in, raw files out."""

from typing import Optional

from kfp import dsl
from kfp.dsl import Dataset, Output

from components.images import DEFAULT


@dsl.container_component
def download(
    dataset: str,
    raw: Output[Dataset],
    seed: str = "98765",
    source: Optional[str] = None,  # noqa: UP045 (kfp needs typing.Optional)
) -> dsl.ContainerSpec:
    """Fetch and verify a dataset's raw files (or generate ``synthetic``).

    Args:
      dataset: ml-100k ... ml-latest-small, movielens, netflix, lastfm, pinterest, synthetic.
      raw: the raw archive(s) and ``download_manifest.json``.
      seed: seed of the synthetic generator, an integer as text (`vaecf download` parses it).
      source: https://, s3:// or file:// URI instead of the public URL (omitted if unset).
    """
    return dsl.ContainerSpec(
        image=DEFAULT.data,
        command=["vaecf", "download"],
        args=["--dataset", dataset, "--output", raw.path, "--seed", seed,
              dsl.IfPresentPlaceholder(input_name="source", then=["--source", source])],
    )
