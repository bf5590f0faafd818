"""What the report may say the data is: a release by name only when its checksum proved it.

``--dataset ml-20m`` accepts any file in ML-20M's layout (a CiteULike zip, a 718-user
``ratings.dat``), and the folder a file sits in proves nothing. So a GroupLens release is
named only when ``vaecf download`` recorded ``verified_release``: the files matched that
release's published MD5. Otherwise the report says what it knows: a MovieLens-layout ratings
file, its layout and the counts ``vaecf preprocess`` read. Datasets that have no releases and
no published checksums (Netflix Prize, Last.fm 360K, Pinterest, synthetic, a user's own table)
are named by the reader that read them, which only accepts their own layout.
"""

from __future__ import annotations

import re
from typing import Any

from vaecf.report.document import fmt_count

NAMES = {"netflix": "Netflix Prize", "lastfm": "Last.fm 360K",
         "pinterest": "Pinterest (pinterest-20)", "synthetic": "synthetic data",
         "table": "a table of interactions (your own data)"}
MOVIELENS_LAYOUT = "a MovieLens-layout ratings file"


def display_name(dataset: str) -> str:
    """A release's readable name: ``ml-1m`` -> ML-1M, ``ml-latest-small`` -> ML-latest-small."""
    if dataset in NAMES:
        return NAMES[dataset]
    size = re.fullmatch(r"ml-(\d+[km])", dataset)
    if size:
        return f"ML-{size.group(1).upper()}"
    return "ML-" + dataset[3:] if dataset.startswith("ml-") else dataset


def is_movielens(dataset: str | None) -> bool:
    """Whether ``dataset`` is read as a MovieLens file (a release name or ``movielens``)."""
    return dataset is not None and (dataset == "movielens" or dataset.startswith("ml-"))


def data_of(manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the data stages recorded: dataset, verified release, layout, counts, settings.

    ``None`` where not recorded; ``preprocess`` and ``split`` hold those stages' parameters,
    ``raw`` the rows, users and items ``vaecf preprocess`` read.
    """
    found: dict[str, Any] = {"dataset": None, "verified_release": None, "layout": None}
    for stage in ("download", "preprocess", "dataset"):
        manifest = manifests.get(stage, {})
        parts = [p for p in (manifest, manifest.get("parameters")) if isinstance(p, dict)]
        for key in found:
            found[key] = found[key] or next((_text(p.get(key)) for p in parts
                                             if _text(p.get(key))), None)
    for stage, key in (("preprocess", "preprocess"), ("dataset", "split")):
        params = manifests.get(stage, {}).get("parameters")
        found[key] = params if isinstance(params, dict) else None
    raw = manifests.get("preprocess", {}).get("counts", {}).get("raw")
    found["raw"] = raw if isinstance(raw, dict) else None
    return found


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def named_release(data: dict[str, Any]) -> str | None:
    """The release the report may name: the checksum-verified one, else None."""
    if not is_movielens(data["dataset"]):
        return data["dataset"]
    return data["verified_release"]


def describe(data: dict[str, Any]) -> str:
    """The data in words, claiming no more than the manifests prove."""
    release = named_release(data)
    if release is not None:
        return display_name(release)
    text = MOVIELENS_LAYOUT
    details = [data["layout"]] if data["layout"] else []
    raw = data["raw"] or {}
    if all(isinstance(raw.get(k), int) for k in ("rows", "users", "items")):
        details.append(f"{fmt_count(raw['rows'])} ratings of {fmt_count(raw['users'])} users "
                       f"x {fmt_count(raw['items'])} items")
    details.append("not a checksum-verified GroupLens release"
                   + (f", though --dataset was {data['dataset']}"
                      if data["dataset"] != "movielens" else ""))
    return f"{text} ({'; '.join(details)})"
