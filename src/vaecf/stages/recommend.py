"""``vaecf recommend``: top-k items for users given by their known items (raw ids).

Reads a ``vaecf train`` output (its SavedModel's ``recommend`` signature and the item index
it was trained on) and a Parquet or CSV file of ``user_id,item_id`` pairs; writes
``recommendations.parquet`` (``user_id``, ``rank`` from 1, ``item_id``, ``score``), users in
ascending ``user_id`` order, never recommending a user's own items. A CSV's ids are text as
written: users ``007`` and ``7`` are two users (a Parquet file's ids keep their column's type).
Item ids are matched against the model's item index as text, an integral float (``4.0``, as
pandas writes ids that went through a float column) as its integer.
Items the model does not know are ignored, counted in the manifest and in a warning line on
stderr: a model can only fold in items it was trained on.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from vaecf import log
from vaecf.data.splits import save_parquet
from vaecf.errors import VaecfError
from vaecf.io import manifest_name, open_input, publish, read_manifest, write_manifest
from vaecf.io.readers import IDS, INDEX, RAW_IDS, read_csv_text, read_parquet
from vaecf.io.roles import Role
from vaecf.metrics.evaluation import chunk_users
from vaecf.serve.model import item_id_map
from vaecf.stages import location, new_parser, run_stage

STAGE = "recommend"
COLUMNS = ("user_id", "item_id")
BATCH_USERS = 1024


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(STAGE, "Top-k recommendations from a trained model for users given "
                        "by their known items.")
    location(parser, "--model", Role.INPUT, required=True, help="'vaecf train' output (dir or s3://)")
    location(parser, "--input", Role.INPUT_FILE, required=True,
                        help="Parquet or CSV file with columns user_id,item_id")
    location(parser, "--output", Role.OUTPUT, manifest=manifest_name(STAGE), required=True,
             help="output directory or s3:// prefix")
    parser.add_argument("--top-k", type=int, default=100, help="items per user")
    return parser


def read_pairs(path: Path) -> pd.DataFrame:
    """The ``user_id,item_id`` pairs of a Parquet or CSV file (raw ids)."""
    if path.suffix == ".parquet":
        frame = read_parquet(path, {c: RAW_IDS for c in COLUMNS}).to_pandas()
    elif path.suffix == ".csv":  # ids are text: 007 is not 7; only an empty field is NA
        frame = read_csv_text(path, COLUMNS)
    else:
        raise VaecfError(f"{path}: expected a .parquet or .csv file")
    if frame.empty:
        raise VaecfError(f"{path}: no rows")
    if frame[list(COLUMNS)].isna().any().any():
        row = int(np.flatnonzero(frame[list(COLUMNS)].isna().any(axis=1).to_numpy())[0])
        raise VaecfError(f"{path}: row {row + 1}: empty user_id or item_id")
    return frame[list(COLUMNS)]


def model_item_ids(model_dir: Path) -> np.ndarray:
    """The raw item id of each item_idx the model scores (n_items,), from its verified output.

    The model's ``item_index.parquet`` (its split's, copied by ``vaecf train``) must list
    item_idx 0 .. n_items - 1 of the model's ``n_items``, each with its own raw id: otherwise
    raw ids would map to the wrong model outputs.
    """
    manifest = read_manifest(model_dir, "train",
                             required=["item_index.parquet", "saved_model/saved_model.pb"])
    n_items = manifest.get("n_items")
    path = model_dir / "item_index.parquet"
    try:
        items = read_parquet(path, {"item_idx": INDEX, "item_id": IDS}).to_pandas()
    except VaecfError as err:
        raise VaecfError(f"{err} (cannot read item_idx, item_id)") from None
    if not isinstance(n_items, int) or not np.array_equal(items["item_idx"].to_numpy(),
                                                          np.arange(n_items)):
        raise VaecfError(f"{path}: does not list item_idx 0 .. n_items - 1 in order "
                         f"(train_manifest.json has n_items {n_items!r})")
    duplicated = items["item_id"].duplicated()
    if duplicated.any():
        raise VaecfError(f"{path}: item_id {items['item_id'][duplicated].iloc[0]} is listed "
                         "twice")
    return items["item_id"].to_numpy()


def id_text(ids: pd.Series) -> pd.Series:
    """Raw item ids as the text they are matched by: ``4.0`` as ``4``.

    The model's item index keeps its ids' type (integers for MovieLens); ids that went through
    a float column (pandas writes them ``4.0``) must still match. User ids are never
    rewritten: they are only told apart, and ``007`` is not ``7``.
    """
    return ids.astype(str).str.replace(r"^(-?\d+)\.0*$", r"\1", regex=True)


def saved_id_map(loaded: object, item_ids: np.ndarray, model_dir: Path) -> np.ndarray:
    """The SavedModel's own raw id map (text), the one ``vaecf serve`` uses.

    ``item_index.parquet`` only gives the ids their type in the output; it must list the
    same ids. A model exported without the map is refused (``item_id_map``).
    """
    text = item_id_map(loaded, str(model_dir / "saved_model"))
    if not np.array_equal(id_text(pd.Series(item_ids)).to_numpy(dtype=object), text):
        raise VaecfError(f"{model_dir / 'item_index.parquet'}: does not list the item ids of "
                         "the SavedModel's id map")
    return text


def recommend(model_dir: Path, item_ids: np.ndarray, pairs: pd.DataFrame,
              top_k: int) -> tuple[pa.Table, int]:
    """Top-k per user; returns the table and the number of pairs with an unknown item.

    Args:
      item_ids: (n_items,) raw id of each of the model's item_idx (``model_item_ids``).
    """
    import tensorflow as tf

    loaded = tf.saved_model.load(str(model_dir / "saved_model"))
    # Python's dict and sort, not pandas' hash tables: those compare text up to a NUL, so
    # user "a<NUL>b" would be user "a".
    position = {text: i for i, text in enumerate(saved_id_map(loaded, item_ids, model_dir))}
    found = np.array([position.get(text, -1) for text in id_text(pairs["item_id"])],
                     dtype=np.int64)
    known = found >= 0
    users, user_of_pair = np.unique(pairs["user_id"].to_numpy(dtype=object),
                                    return_inverse=True)
    rows, items = user_of_pair[known], found[known]
    order = np.lexsort((items, rows))
    rows, items = rows[order], items[order]
    # A pair given twice (or as 4 and 4.0) is one known item, as in ``vaecf serve``.
    first = np.ones(rows.size, dtype=bool)
    first[1:] = (rows[1:] != rows[:-1]) | (items[1:] != items[:-1])
    rows, items = rows[first], items[first]
    splits = np.searchsorted(rows, np.arange(users.size + 1))
    signature = loaded.signatures["recommend"]
    top_items, top_scores = [], []
    progress = log.Progress("recommending", total=users.size, unit="users")
    batch_users = chunk_users(BATCH_USERS, item_ids.size)
    for start in range(0, users.size, batch_users):
        stop = min(start + batch_users, users.size)
        out = signature(row_splits=tf.constant(splits[start:stop + 1] - splits[start]),
                        item_idx=tf.constant(items[splits[start]:splits[stop]]),
                        k=tf.constant(top_k, tf.int32))
        top_items.append(out["item_idx"].numpy())
        top_scores.append(out["scores"].numpy())
        progress.update(stop - start)
    progress.close()
    ranked, scores = np.concatenate(top_items), np.concatenate(top_scores)
    valid = np.isfinite(scores)  # -inf: the user has fewer than k unknown items
    k = ranked.shape[1]
    table = pa.table({
        "user_id": np.repeat(users, k)[valid.ravel()],
        "rank": np.tile(np.arange(1, k + 1, dtype=np.int32), users.size)[valid.ravel()],
        "item_id": item_ids[ranked[valid]],
        "score": scores[valid].astype(np.float32)})
    return table, int((~known).sum())


def _body(args: argparse.Namespace) -> None:
    started = time.monotonic()
    if args.top_k < 1:
        raise VaecfError(f"--top-k {args.top_k}: expected a positive integer")
    pairs = read_pairs(Path(args.input))
    with (publish(args.output, manifest_name(STAGE), [args.model, args.input]) as staging,
          open_input(args.model) as model_dir):
        item_ids = model_item_ids(model_dir)
        if args.top_k > item_ids.size:
            raise VaecfError(f"--top-k {args.top_k}: the model scores {item_ids.size:,} items "
                             f"(use at most {item_ids.size})")
        table, unknown = recommend(model_dir, item_ids, pairs, args.top_k)
        users = len(np.unique(pairs["user_id"].to_numpy(dtype=object)))
        if unknown:
            log.warning(f"vaecf {STAGE}: warning: {unknown:,} of {len(pairs):,} pairs name an "
                        "item the model was not trained on; ignored")
        save_parquet(staging / "recommendations.parquet", table)
        write_manifest(staging, STAGE, inputs={"model": args.model, "input": args.input},
                       parameters={"top_k": args.top_k},
                       counts={"users": users,
                               "pairs": len(pairs), "unknown_item_pairs": unknown,
                               "recommendations": table.num_rows}, started=started)
    log.info(f"{table.num_rows:,} recommendations for {users:,} users "
             f"written to {args.output} ({unknown:,} pairs with an unknown item ignored)")


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, build_parser(), argv, _body)
