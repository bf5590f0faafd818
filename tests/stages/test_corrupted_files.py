"""Every file vaecf writes, edited or damaged, fed to every stage that reads it.

A file vaecf wrote and someone changed since is a user's file like any other. Each one is
corrupted in the standard ways (truncated, the wrong JSON type, text where a number is, too
large, not UTF-8; for Parquet and NPZ also a wrong column type or a header that claims more
than the file holds) and its checksum in the manifest brought up to date, so that only the
reader can catch it. Every stage that reads it must stop with one line naming the file and
write nothing: never a traceback.
"""

from __future__ import annotations

import io
import json
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vaecf.io import readers
from vaecf.io.manifest import sha256_file

SMALL = ("--epochs", "1", "--batch-size", "100", "--hidden", "16", "--latent", "8")
LIMIT = 256 * 1024  # the JSON bound in these tests (the real one is 64 MiB)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real outputs of every stage whose files are attacked (treated as read-only)."""
    from vaecf.cli import main

    root = tmp_path_factory.mktemp("made")
    out = {name: root / name for name in ("raw", "inter", "split", "model", "metrics")}
    runs = [["download", "--dataset", "synthetic", "--synthetic-users", "400",
             "--synthetic-items", "120", "--output", out["raw"]],
            ["preprocess", "--input", out["raw"], "--output", out["inter"]],
            ["split", "--input", out["inter"], "--output", out["split"]],
            ["train", "--split", out["split"], "--output", out["model"], *SMALL,
             "--checkpoint-dir", root / "ckpt"],
            ["evaluate", "--split", out["split"], "--model", out["model"], "--output",
             out["metrics"]]]
    for argv in runs:
        assert main([str(a) for a in argv]) == 0, argv
    out["ckpt"] = root / "ckpt"
    return out


def _json(edit: Callable[[object], object]) -> Callable[[bytes], bytes]:
    return lambda data: json.dumps(edit(json.loads(data))).encode()


def _set(key: str, value: object) -> Callable[[bytes], bytes]:
    def change(doc: object) -> object:
        target = doc
        *path, last = key.split(".")
        for part in path:
            target = target[part]  # type: ignore[index]
        target[last] = value  # type: ignore[index]
        return doc
    return _json(change)


def _jsonl(edit: Callable[[bytes], bytes]) -> Callable[[bytes], bytes]:
    """Apply ``edit`` to the first line of a JSON lines file."""
    def change(data: bytes) -> bytes:
        first, _, rest = data.partition(b"\n")
        return edit(first) + b"\n" + rest
    return change


JSON_DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "truncated": lambda data: data[: len(data) // 2],
    "wrong-type": lambda data: b"[" + data + b"]",
    "not-utf8": lambda data: b"\xff\xfe" + data,
    "huge": lambda data: data + b" " * (LIMIT + 1),
}


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def _npz_claims_too_much(data: bytes) -> bytes:
    """Rewrite the header of the archive's ``data.npy`` to claim 10^12 elements."""
    source = zipfile.ZipFile(io.BytesIO(data))
    sink = io.BytesIO()
    with zipfile.ZipFile(sink, "w") as target:
        for info in source.infolist():
            member = source.read(info)
            if info.filename == "data.npy":
                array = np.load(io.BytesIO(member))
                header = io.BytesIO()
                np.lib.format.write_array_header_1_0(header, {
                    "descr": np.lib.format.dtype_to_descr(array.dtype),
                    "fortran_order": False, "shape": (10**12,)})
                member = header.getvalue() + array.tobytes()
            target.writestr(info, member)
    return sink.getvalue()


PARQUET_DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "truncated": lambda data: data[: len(data) // 2],
    "text": lambda data: b"user_id,item_id\n1,2\n",
}
NPZ_DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "truncated": lambda data: data[: len(data) // 2],
    "text": lambda data: b"not an archive",
    "claims-too-much": _npz_claims_too_much,
}


def _list_column(column: str) -> Callable[[bytes], bytes]:
    def change(data: bytes) -> bytes:
        table = pq.read_table(io.BytesIO(data))
        values = pa.array([[v] for v in table.column(column).to_pylist()])
        return _parquet(table.set_column(table.schema.get_field_index(column), column,
                                         values))
    return change


def _float_column(column: str) -> Callable[[bytes], bytes]:
    def change(data: bytes) -> bytes:
        table = pq.read_table(io.BytesIO(data))
        values = pa.array([float(v) + 0.5 for v in range(table.num_rows)])
        return _parquet(table.set_column(table.schema.get_field_index(column), column,
                                         values))
    return change


# (output, file) -> damages; (output, file) -> the runs that read it: (stage, argv).
FILES: dict[tuple[str, str], dict[str, Callable[[bytes], bytes]]] = {
    ("raw", "download_manifest.json"): {**JSON_DAMAGE, "text-number": _set("files", "x")},
    ("inter", "preprocess_manifest.json"): {**JSON_DAMAGE,
                                            "text-number": _set("files", 7)},
    ("inter", "interactions.parquet"): {**PARQUET_DAMAGE, "list-ids": _list_column("user_id"),
                                        "float-ids": _float_column("item_id")},
    ("split", "dataset_manifest.json"): {**JSON_DAMAGE, "text-number": _set("n_items", "x"),
                                         "text-count": _set("n_users.train", "many")},
    ("split", "train.npz"): NPZ_DAMAGE,
    ("split", "train.parquet"): {**PARQUET_DAMAGE, "list-index": _list_column("user_idx"),
                                 "float-index": _float_column("item_idx")},
    ("split", "item_index.parquet"): {**PARQUET_DAMAGE,
                                      "list-ids": _list_column("item_id"),
                                      "float-index": _float_column("item_idx")},
    ("model", "train_manifest.json"): {**JSON_DAMAGE, "text-number": _set("n_items", "x")},
    ("model", "item_index.parquet"): {**PARQUET_DAMAGE,
                                      "list-ids": _list_column("item_id")},
    ("model", "train_log.jsonl"): {**JSON_DAMAGE,
                                   "text-number": _jsonl(_set("loss", "low"))},
    ("metrics", "metrics.json"): {**JSON_DAMAGE,
                                  "text-number": _set("recall_at_20.mean", "high")},
}


# (output, file) -> the runs that read it.
READERS: dict[tuple[str, str], list[str]] = {
    ("raw", "download_manifest.json"): ["preprocess", "report-manifests"],
    ("inter", "preprocess_manifest.json"): ["split"],
    ("inter", "interactions.parquet"): ["split"],
    ("split", "dataset_manifest.json"): ["train", "evaluate-popularity"],
    ("split", "train.npz"): ["evaluate-popularity"],  # training reads train.parquet
    ("split", "train.parquet"): ["train"],
    ("split", "item_index.parquet"): ["train", "evaluate-popularity"],
    ("model", "train_manifest.json"): ["evaluate-model", "recommend", "report-model"],
    ("model", "item_index.parquet"): ["recommend"],
    ("model", "train_log.jsonl"): ["report-train-log"],
    ("metrics", "metrics.json"): ["report-metrics"],
}


def run_argv(run: str, work: Path) -> list[str]:
    """``vaecf`` argv of ``run`` on the copies in ``work``, publishing to ``work/out``."""
    out = ["--output", str(work / "out")]
    return {
        "preprocess": ["preprocess", "--input", str(work / "raw"), *out],
        "report-manifests": ["report", "--manifests", str(work / "raw"), *out],
        "split": ["split", "--input", str(work / "inter"), *out],
        "train": ["train", "--split", str(work / "split"), *out, *SMALL, "--checkpoint-dir",
                  str(work / "ck")],
        "evaluate-popularity": ["evaluate", "--split", str(work / "split"), "--model",
                                "popularity", *out],
        "evaluate-model": ["evaluate", "--split", str(work / "split"), "--model",
                           str(work / "model"), *out],
        "recommend": ["recommend", "--model", str(work / "model"), "--input",
                      str(work / "pairs.csv"), *out],
        "report-model": ["report", "--manifests", str(work / "model"), *out],
        "report-train-log": ["report", "--train-log", str(work / "model" / "train_log.jsonl"),
                             *out],
        "report-metrics": ["report", "--metrics", str(work / "metrics" / "metrics.json"),
                           *out],
    }[run]


# What a reader only shows as given, computing nothing from it: the report prints a model's
# n_items from its manifest (text or not), as it prints every provenance field.
SHOWN_ONLY = {("model", "train_manifest.json", "text-number", "report-model")}
CASES = [(output, file, damage, run) for (output, file), damages in FILES.items()
         for damage in damages for run in READERS[(output, file)]
         if (output, file, damage, run) not in SHOWN_ONLY]


def _damage(path: Path, how: Callable[[bytes], bytes]) -> None:
    """Damage ``path`` and bring its manifest's checksum up to date."""
    path.write_bytes(how(path.read_bytes()))
    for manifest in path.parent.glob("*_manifest.json"):
        if manifest == path:
            continue
        doc = json.loads(manifest.read_text())
        entry = doc.get("files", {}).get(path.name)
        if entry is not None:
            entry.update(sha256=sha256_file(path), bytes=path.stat().st_size)
            manifest.write_text(json.dumps(doc))


@pytest.mark.parametrize("output,file,damage,run", CASES,
                         ids=[f"{o}/{f}-{d}-{r}" for o, f, d, r in CASES])
def test_a_damaged_file_is_one_line_naming_it(cli, made: dict[str, Path], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch, output: str,
                                              file: str, damage: str, run: str) -> None:
    work = tmp_path / "work"
    monkeypatch.setattr(readers, "JSON_LIMIT", LIMIT)
    monkeypatch.setattr(readers, "JSONL_LIMIT", LIMIT)
    for name, path in made.items():
        shutil.copytree(path, work / name, symlinks=True)
    items = pq.read_table(made["model"] / "item_index.parquet").column("item_id").to_pylist()
    (work / "pairs.csv").write_text("user_id,item_id\n" + "".join(f"u,{i}\n"
                                                                   for i in items[:5]))
    _damage(work / output / file, FILES[(output, file)][damage])
    stage, *argv = run_argv(run, work)
    code, _, err = cli(stage, *argv)
    assert code == 1, f"{stage} accepted {output}/{file} ({damage}): {err[-2000:]}"
    assert len(err.strip().splitlines()) == 1, err[-3000:]
    assert err.startswith(f"vaecf {stage}: error: "), err
    assert file in err, err
    assert not (work / "out").exists()


@pytest.mark.parametrize("damage", ["list", "text-epoch", "truncated", "not-utf8",
                                    "huge-epoch"])
def test_a_damaged_checkpoint_is_skipped_and_training_starts_afresh(
        cli, made: dict[str, Path], tmp_path: Path, damage: str) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(made["ckpt"], ckpt)
    [meta] = sorted(ckpt.glob("epoch-*/meta.json"))
    data = meta.read_bytes()
    meta.write_bytes({"list": b"[" + data + b"]",
                      "text-epoch": _set("epoch", "one")(data),
                      "truncated": data[: len(data) // 2],
                      "not-utf8": b"\xff" + data,
                      "huge-epoch": _set("epoch", 10**30)(data)}[damage])
    code, out, err = cli("train", "--split", made["split"], "--output", tmp_path / "model",
                         *SMALL, "--checkpoint-dir", ckpt)
    assert code == 0, err[-3000:]
    assert f"{meta.parent.name} is unusable" in out and "resuming" not in out


def test_readers_bound_what_they_read(tmp_path: Path) -> None:
    from vaecf.errors import VaecfError

    (tmp_path / "big.json").write_bytes(b"{}" + b" " * 100)
    with pytest.raises(VaecfError, match=r"big\.json: larger than 64 bytes"):
        readers.read_json(tmp_path / "big.json", limit=64)
    with pytest.raises(VaecfError, match="not a regular file"):
        readers.read_text(Path("/dev/zero"))
    assert readers.read_json(tmp_path / "big.json") == {}
