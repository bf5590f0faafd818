"""End to end: ``vaecf demo`` runs all six stages through their CLIs on a tiny synthetic set."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from vaecf.io import open_input

pytestmark = [pytest.mark.slow, pytest.mark.horovod]

TINY = ["--users", "800", "--items", "300", "--epochs", "12", "--batch-size", "100"]


def test_demo_two_workers_beats_popularity_and_reports_it(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    code, stdout, stderr = cli("demo", "--output", out, "--workers", "2", *TINY)
    assert code == 0, stderr
    metrics = json.loads((out / "metrics" / "metrics.json").read_text())
    vae = metrics["ndcg_at_100"]["mean"]
    popularity = metrics["baselines"]["popularity"]["ndcg_at_100"]["mean"]
    assert vae > popularity + 0.05, (vae, popularity)
    assert metrics["users_evaluated"] > 0
    log = [json.loads(line) for line in (out / "model" / "train_log.jsonl").read_text()
           .splitlines()]
    assert len(log) == 12 and {row["world_size"] for row in log} == {2}
    report = json.loads((out / "report" / "report.json").read_text())
    assert report["accuracy"]["metrics"]["ndcg_at_100"]["mean"] == vae
    for name in ("report.md", "report.html"):
        text = (out / "report" / name).read_text()
        assert f"{vae:.4f}" in text and f"{popularity:.4f}" in text, name
    assert f"ndcg_at_100 {vae:.4f}" in stdout
    for stage, manifest in [("raw", "download"), ("interactions", "preprocess"),
                            ("split", "dataset"), ("model", "train"), ("metrics", "evaluate"),
                            ("report", "report")]:
        assert (out / stage / f"{manifest}_manifest.json").is_file()


def test_demo_through_s3(cli, s3_bucket: str) -> None:  # type: ignore[no-untyped-def]
    store = f"s3://{s3_bucket}/demo"
    code, stdout, stderr = cli("demo", "--output", store, "--workers", "1",
                               "--users", "400", "--items", "200", "--epochs", "2",
                               "--batch-size", "100")
    assert code == 0, stderr
    with open_input(f"{store}/report") as report:
        assert (report / "report.html").stat().st_size > 1000
    assert f"report at {store}/report/report.html" in stdout


def test_demo_on_a_movielens_1m_zip(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``make demo DATASET=ml-1m SOURCE=ml-1m.zip``, on a small zip in ML-1M's layout."""
    rng = np.random.default_rng(5)
    weights = 1.0 / np.arange(1, 151)
    lines = [f"{user}::{item}::{rng.integers(3, 6)}::97830{user:04d}\n"
             for user in range(1, 301)
             for item in rng.choice(150, size=int(rng.integers(15, 40)), replace=False,
                                    p=weights / weights.sum()) + 1]
    source = tmp_path / "ml-1m-sample.zip"  # not ml-1m.zip: that name must match GroupLens' MD5
    with zipfile.ZipFile(source, "w") as archive:
        archive.writestr("ml-1m/ratings.dat", "".join(lines))
        archive.writestr("ml-1m/users.dat", "1::F::1::10::48067\n")
    out = tmp_path / "run"
    code, stdout, stderr = cli("demo", "--dataset", "ml-1m", "--source", source, "--output", out,
                               "--workers", "1", "--epochs", "2", "--batch-size", "100")
    assert code == 0, stderr
    download = json.loads((out / "raw" / "download_manifest.json").read_text())
    assert (download["dataset"], download["layout"], download["release"]) == (
        "ml-1m", "ratings.dat", "ml-1m")
    preprocess = json.loads((out / "interactions" / "preprocess_manifest.json").read_text())
    assert preprocess["counts"]["raw"]["rows"] == len(lines)
    assert json.loads((out / "metrics" / "metrics.json").read_text())["users_evaluated"] > 0
    assert "report at" in stdout
