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
    user_column: Optional[str] = None,  # noqa: UP045
    item_column: Optional[str] = None,  # noqa: UP045
    value_column: Optional[str] = None,  # noqa: UP045
    value_kind: Optional[str] = None,  # noqa: UP045
) -> dsl.ContainerSpec:
    """Fetch and verify a dataset's raw files (or generate ``synthetic``).

    Args:
      dataset: ml-100k ... ml-latest-small, movielens, netflix, lastfm, pinterest, synthetic, table.
      raw: the raw archive(s) and ``download_manifest.json``.
      seed: seed of the synthetic generator, an integer as text (`vaecf download` parses it).
      source: https://, s3:// or file:// URI instead of the public URL (omitted if unset).
      user_column: table (your own Parquet or CSV interactions): the user ids' column.
      item_column: table: the item ids' column.
      value_column: table: a rating or play count column; unset, every row is a positive.
      value_kind: table: what value_column holds, ``rating`` or ``plays``.
    """
    return dsl.ContainerSpec(
        image=DEFAULT.data,
        command=["vaecf", "download"],
        args=["--dataset", dataset, "--output", raw.path, "--seed", seed,
              dsl.IfPresentPlaceholder(input_name="source", then=["--source", source]),
              dsl.IfPresentPlaceholder(input_name="user_column",
                                       then=["--user-column", user_column]),
              dsl.IfPresentPlaceholder(input_name="item_column",
                                       then=["--item-column", item_column]),
              dsl.IfPresentPlaceholder(input_name="value_column",
                                       then=["--value-column", value_column]),
              dsl.IfPresentPlaceholder(input_name="value_kind",
                                       then=["--value-kind", value_kind])],
    )
