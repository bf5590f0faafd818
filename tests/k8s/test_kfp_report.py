"""The pipeline's report step: the real ``vaecf report`` runs, then the KFP artifacts are
filled (Markdown, HTML) and the metrics land in KFP's executor output as artifact metadata."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vaecf.stages import kfp_report

METRICS = {
    "subset": "test", "model": "/kfp/model", "device": "CPU", "n_items": 300,
    "recall_at_20": {"mean": 0.25, "stderr": 0.01},
    "recall_at_50": {"mean": 0.5, "stderr": 0.02},
    "ndcg_at_100": {"mean": 0.375, "stderr": 0.015},
    "users_evaluated": 120, "users_skipped": 2, "users_per_second": 1000.0,
    "baselines": {"popularity": {"recall_at_20": {"mean": 0.125, "stderr": 0.01},
                                 "recall_at_50": {"mean": 0.25, "stderr": 0.01},
                                 "ndcg_at_100": {"mean": 0.1875, "stderr": 0.01},
                                 "users_evaluated": 120, "users_skipped": 2}},
}


def executor_input(out: Path) -> dict[str, Any]:
    """What KFP passes as ``{{$}}`` (only the fields the step reads, plus noise)."""
    metrics = {"name": "projects/p/artifacts/7", "uri": "minio://mlpipeline/v2/run/metrics",
               "type": {"schemaTitle": "system.Metrics", "schemaVersion": "0.0.1"}}
    return {"inputs": {"parameterValues": {}},
            "outputs": {"artifacts": {"metrics": {"artifacts": [metrics]}},
                        "outputFile": str(out / "tmp" / "kfp_outputs" / "output_metadata.json")}}


def write_train_log(path: Path) -> None:
    rows = []
    for epoch in (1, 2):
        row: dict[str, Any] = dict(
            epoch=epoch, step=10 * epoch, loss=800.0 - epoch, nll=790.0, kl=10.0,
            beta=0.1 * epoch, epoch_seconds=2.0, users_per_second=300.0, input_seconds=0.5,
            input_share=0.25, skipped_steps=0, loss_scale=None, precision="fp32",
            world_size=1, batch_size=64)
        if epoch == 2:
            row["val"] = {"recall_at_20": 0.2, "recall_at_50": 0.4, "ndcg_at_100": 0.3}
        rows.append(json.dumps(row))
    path.write_text("\n".join(rows) + "\n")


def test_report_fills_markdown_html_and_kfp_metrics(tmp_path: Path) -> None:
    (tmp_path / "metrics.json").write_text(json.dumps(METRICS))
    write_train_log(tmp_path / "train_log.jsonl")
    kfp = executor_input(tmp_path)
    code = kfp_report.main([
        "--executor-input", json.dumps(kfp), "--markdown", str(tmp_path / "md" / "report.md"),
        "--html", str(tmp_path / "html"), "--metrics-artifact", "metrics",
        "--metrics-path", str(tmp_path / "metrics_artifact"), "--",
        "--output", str(tmp_path / "report"), "--train-log", str(tmp_path / "train_log.jsonl"),
        "--metrics", str(tmp_path / "metrics.json")])
    assert code == 0
    report = tmp_path / "report"
    assert (tmp_path / "md" / "report.md").read_bytes() == (report / "report.md").read_bytes()
    assert (tmp_path / "html").read_bytes() == (report / "report.html").read_bytes()
    expected = {"recall_at_20": 0.25, "recall_at_20_stderr": 0.01, "recall_at_50": 0.5,
                "recall_at_50_stderr": 0.02, "ndcg_at_100": 0.375, "ndcg_at_100_stderr": 0.015,
                "users_evaluated": 120.0, "users_skipped": 2.0,
                "popularity_recall_at_20": 0.125, "popularity_recall_at_50": 0.25,
                "popularity_ndcg_at_100": 0.1875}
    output = json.loads(Path(kfp["outputs"]["outputFile"]).read_text())
    (artifact,) = output["artifacts"]["metrics"]["artifacts"]
    assert artifact["metadata"] == expected
    assert artifact["uri"] == "minio://mlpipeline/v2/run/metrics"
    assert json.loads((tmp_path / "metrics_artifact").read_text()) == expected


def test_missing_metrics_artifact_is_one_line_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "metrics.json").write_text(json.dumps(METRICS))
    kfp = {"outputs": {"artifacts": {}, "outputFile": str(tmp_path / "out.json")}}
    code = kfp_report.main([
        "--executor-input", json.dumps(kfp), "--markdown", str(tmp_path / "m.md"),
        "--html", str(tmp_path / "h.html"), "--metrics-path", str(tmp_path / "m"), "--",
        "--output", str(tmp_path / "report"), "--metrics", str(tmp_path / "metrics.json")])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("vaecf kfp-report: error: --executor-input: no output artifact "
                          "'metrics'") and err.count("\n") == 1
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "report").exists()
