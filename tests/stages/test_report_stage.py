"""``vaecf report``: numbers equal the inputs, partial inputs render, the HTML is
self-contained and renders in headless Chromium, malformed inputs are named."""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from pathlib import Path

import chromium
import pytest

from vaecf.report.benchstats import summarize

KEYS = ("recall_at_20", "recall_at_50", "ndcg_at_100")
PAGE_LINKS = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)


def _metric(mean: float, stderr: float) -> dict[str, float]:
    return {"mean": mean, "stderr": stderr}


def write_inputs(root: Path) -> dict[str, Path]:
    """A train log, metrics with baselines and a benchmark, shaped as the stages write them."""
    log = []
    for epoch in range(1, 5):
        entry = {"epoch": epoch, "step": 7 * epoch, "loss": 812.5 - 40.25 * epoch,
                 "nll": 800.0 - 41.0 * epoch, "kl": 20.0 + epoch, "beta": 0.05 * epoch,
                 "epoch_seconds": 10.0 + epoch, "users_per_second": 1500.0 + 10 * epoch,
                 "input_seconds": 0.5, "input_share": 0.5 / (10.0 + epoch),
                 "skipped_steps": 0, "loss_scale": None, "precision": "mixed_bfloat16",
                 "world_size": 2, "batch_size": 512}
        if epoch % 2 == 0:
            entry["val"] = {"recall_at_20": 0.2, "recall_at_50": 0.3,
                            "ndcg_at_100": 0.25 + 0.01 * epoch}
        log.append(entry)
    paths = {"log": root / "train_log.jsonl", "metrics": root / "metrics.json",
             "benchmark": root / "benchmark.json"}
    paths["log"].write_text("".join(json.dumps(e) + "\n" for e in log))
    paths["metrics"].write_text(json.dumps({
        "subset": "test", "model": "trained", "recall_at_20": _metric(0.38712, 0.00213),
        "recall_at_50": _metric(0.52388, 0.00201), "ndcg_at_100": _metric(0.41234, 0.00188),
        "users_evaluated": 9990, "users_skipped": 10, "users_per_second": 5000.0,
        "device": "cpu", "n_items": 20108,
        "timing": {"process_seconds_before_stage": 3.25, "load_seconds": 1.5,
                   "first_chunk_seconds": 0.75, "first_chunk_users": 4096,
                   "startup_seconds": 5.5, "steady_seconds": 1.0, "users_per_second": 5000.0},
        "baselines": {"popularity": {"recall_at_20": _metric(0.16, 0.002),
                                     "recall_at_50": _metric(0.25, 0.002),
                                     "ndcg_at_100": _metric(0.2, 0.002)},
                      "ease": {"recall_at_20": _metric(0.391, 0.002),
                               "recall_at_50": _metric(0.521, 0.002),
                               "ndcg_at_100": _metric(0.4187, 0.002),
                               "paired": {key: {"test": "paired z-test on per-user "
                                                "differences", "users": 9990,
                                                "delta": -0.0064, "stderr": 0.002,
                                                "z": -3.2} for key in KEYS}}}}))
    runs = [{"precision": p, "world_size": w, "batch_size": 512, "status": "ok",
             "device": "1 x GPU Test GPU (driver 1.2), CUDA 12.3, cuDNN 8",
             "users_per_second": u, "steps_per_second": u / 512, "epoch_seconds": 9.0,
             "input_share": 0.05, "time_to_target_seconds": None, "bound_fraction": 0.125}
            for p, w, u in [("fp32", 1, 1000.0), ("fp32", 1, 1100.0),
                            ("mixed_bfloat16", 1, 1700.0), ("fp32", 2, 1800.0)]]
    paths["benchmark"].write_text(json.dumps({
        "runs": runs, "configs": summarize(runs), "target_ndcg": None,
        "work": {"steps": 20, "epochs": None, "warmup_epochs": 1, "repeats": 2},
        "compute_bound": {"flops_per_user": 3.6e7, "formula": "3 * forward",
                          "matmul_flops_per_second": {"fp32": 1.0e11}},
        "fingerprint": {"cpu_model": "Test CPU", "cpu_cores": 2, "gpu_count": 0}}))
    return paths


def test_numbers_in_the_report_equal_the_inputs(cli, tmp_path: Path, synthetic_split) -> None:
    paths = write_inputs(tmp_path)
    out = tmp_path / "report"
    code, _, err = cli("report", "--output", out, "--train-log", paths["log"], "--metrics",
                       paths["metrics"], "--benchmark", paths["benchmark"], "--manifests",
                       synthetic_split())
    assert code == 0, err
    data = json.loads((out / "report.json").read_text())
    markdown, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert data["accuracy"]["metrics"]["ndcg_at_100"]["mean"] == 0.41234
    assert data["accuracy"]["baselines"]["ease"]["ndcg_at_100"]["mean"] == 0.4187
    assert [e["loss"] for e in data["training"]["epochs"]] == [772.25, 732.0, 691.75, 651.5]
    assert data["training"]["best"] == {"epoch": 4, "ndcg_at_100": 0.29, "seconds": 50.0}
    # medians: fp32 x1 = 1050, bf16 x1 = 1700 -> 1.62x; fp32 x2 = 1800 -> 1.71x, 85.7%
    assert data["speed"]["precision_speedups"][0]["speedup"] == pytest.approx(1700 / 1050)
    manifest = json.loads((synthetic_split() / "dataset_manifest.json").read_text())
    train_pairs = f"{manifest['counts']['pairs']['train']:,}"
    for text in ("0.4123", "0.0019", "0.3871", "0.5239", "0.4187", "0.2000", "9,990",
                 "772.2500", "651.5000", "0.2900", "1,050.0", "1.62x", "1.71x", "85.7%",
                 "12.5%", "Test CPU", "The data is synthetic data; the paper published",
                 train_pairs, "Device: 1 x GPU Test GPU (driver 1.2), CUDA 12.3, cuDNN 8.",
                 "5,000.0 users/s after a start-up of 5.50 s", "first chunk of 4,096 users"):
        assert text in markdown, text
        assert text in page, text
    assert markdown.index("## Verdict") < markdown.index("## Accuracy")
    assert (out / "report_manifest.json").is_file()


def test_a_report_with_only_some_inputs_renders(cli, tmp_path: Path) -> None:
    paths = write_inputs(tmp_path)
    code, _, err = cli("report", "--output", tmp_path / "only-log", "--train-log", paths["log"])
    assert code == 0, err
    data = json.loads((tmp_path / "only-log" / "report.json").read_text())
    assert {"training", "verdict"} <= set(data) and "accuracy" not in data
    markdown = (tmp_path / "only-log" / "report.md").read_text()
    assert "## Training curves" in markdown and "## Accuracy" not in markdown
    assert "## Speed" not in markdown
    code, _, err = cli("report", "--output", tmp_path / "only-bench", "--benchmark",
                       paths["benchmark"])
    assert code == 0, err
    assert "## Speed" in (tmp_path / "only-bench" / "report.md").read_text()


def test_rerun_gives_identical_files(cli, tmp_path: Path) -> None:
    paths = write_inputs(tmp_path)
    args = ["--train-log", paths["log"], "--metrics", paths["metrics"], "--benchmark",
            paths["benchmark"]]
    assert cli("report", "--output", tmp_path / "a", *args)[0] == 0
    assert cli("report", "--output", tmp_path / "b", *args)[0] == 0
    for name in ("report.md", "report.html", "report.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_html_is_self_contained_and_renders_in_chromium(cli, tmp_path: Path) -> None:
    paths = write_inputs(tmp_path)
    out = tmp_path / "report"
    assert cli("report", "--output", out, "--train-log", paths["log"], "--metrics",
               paths["metrics"], "--benchmark", paths["benchmark"])[0] == 0
    page = (out / "report.html").read_text()
    assert not PAGE_LINKS.search(page)
    assert page.count('src="data:image/png;base64,') >= 3  # curves, throughput, scaling
    pixels = chromium.screenshot((out / "report.html").as_uri(), tmp_path / "shot.png",
                                 tmp_path / "profile")
    assert pixels.shape[:2] == (2000, 1200)
    assert pixels[..., :3].std() > 0.05  # a blank page has none
    assert (pixels[..., :3].mean(axis=2) < 0.5).mean() > 0.01  # some dark text and lines


def test_malformed_input_is_named_and_nothing_is_written(cli, tmp_path: Path) -> None:
    paths = write_inputs(tmp_path)
    paths["metrics"].write_text('{"recall_at_20": ')
    out = tmp_path / "report"
    code, _, err = cli("report", "--output", out, "--train-log", paths["log"], "--metrics",
                       paths["metrics"])
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("vaecf report: error: ")
    assert f"{paths['metrics']}: not valid JSON" in err
    assert not out.exists()


def test_a_tampered_manifest_directory_is_refused(cli, tmp_path: Path, synthetic_split) -> None:
    copy = tmp_path / "split"
    shutil.copytree(synthetic_split(), copy)
    (copy / "train.npz").write_bytes(b"changed")
    code, _, err = cli("report", "--output", tmp_path / "r", "--manifests", copy)
    assert code == 1 and "train.npz: SHA-256 does not match" in err


def test_no_input_is_an_error(cli, tmp_path: Path) -> None:
    code, _, err = cli("report", "--output", tmp_path / "r")
    assert code == 1 and "nothing to report" in err


def test_inputs_and_output_on_s3(cli, tmp_path: Path, s3_bucket: str) -> None:
    import boto3

    paths = write_inputs(tmp_path)
    s3 = boto3.client("s3")
    s3.upload_file(str(paths["metrics"]), s3_bucket, "run/metrics.json")
    code, _, err = cli("report", "--output", f"s3://{s3_bucket}/run/report", "--metrics",
                       f"s3://{s3_bucket}/run/metrics.json")
    assert code == 0, err
    body = s3.get_object(Bucket=s3_bucket, Key="run/report/report.json")["Body"].read()
    assert json.loads(body)["accuracy"]["metrics"]["recall_at_20"]["mean"] == 0.38712


def test_dataset_funnel_equals_the_data_stages_counts(cli, tmp_path: Path) -> None:
    raw, inter, split = tmp_path / "raw", tmp_path / "interactions", tmp_path / "split"
    assert cli("download", "--dataset", "synthetic", "--output", raw, "--synthetic-users",
               "300", "--synthetic-items", "120")[0] == 0
    assert cli("preprocess", "--input", raw, "--output", inter)[0] == 0
    assert cli("split", "--input", inter, "--output", split)[0] == 0
    code, _, err = cli("report", "--output", tmp_path / "report", "--manifests", raw, inter,
                       split)
    assert code == 0, err
    counts = json.loads((inter / "preprocess_manifest.json").read_text())["counts"]
    dataset = json.loads((split / "dataset_manifest.json").read_text())
    funnel = json.loads((tmp_path / "report" / "report.json").read_text())["funnel"]
    steps = {row["step"]: row for row in funnel}
    assert steps["raw rows"]["pairs"] == counts["raw"]["rows"]
    assert steps["implicit positives"]["pairs"] == counts["implicit"]["rows"]
    assert steps["user filter"]["users"] == counts["user_filter"]["users"]
    assert steps["split: train"]["pairs"] == dataset["counts"]["pairs"]["train"]
    val = dataset["counts"]["pairs"]["val_fold_in"] + dataset["counts"]["pairs"]["val_holdout"]
    assert steps["split: val (fold_in + holdout)"]["pairs"] == val
    assert [row["step"] for row in funnel][:2] == ["raw rows", "implicit positives"]
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert f"| raw rows | {counts['raw']['rows']:,} |" in markdown
    assert "| seed | 98765 |" in markdown  # parameters as given, not as measurements


def test_speed_against_a_reference_run(cli, tmp_path: Path) -> None:
    paths = write_inputs(tmp_path)
    reference = json.loads(paths["benchmark"].read_text())
    for config in reference["configs"]:
        config["users_per_second"] = {"min": 800.0, "median": 840.0}
    (tmp_path / "previous.json").write_text(json.dumps(reference))
    out = tmp_path / "report"
    code, _, err = cli("report", "--output", out, "--benchmark", paths["benchmark"],
                       "--reference", tmp_path / "previous.json")
    assert code == 0, err
    data = json.loads((out / "report.json").read_text())
    ratios = {r["config"]: r["ratio"] for r in data["speed"]["versus_reference"]}
    assert ratios["fp32 x1 b512"] == pytest.approx(1050 / 840)  # median of 1000 and 1100
    markdown = (out / "report.md").read_text()
    verdict = markdown[:markdown.index("## Speed")]
    assert ("Against the reference run, fp32 x1 b512 runs at 1.25x its speed "
            "(1,050.0 vs 840.0 users/s)") in verdict


def test_report_says_what_it_knows_of_an_unverified_release(cli, tmp_path: Path) -> None:
    """An ML-1M-layout zip (ratings.dat, '::') through the real data stages: no published
    checksum matched, so the report names no release (neither ML-1M nor ML-20M), says what it
    read, and compares with no published number."""
    lines = [f"{user}::{item}::5::97830076{item % 10}\n" for user in range(1, 61)
             for item in range(1 + user % 7, 21, 2)]
    archive = tmp_path / "ml-1m-sample.zip"  # not ml-1m.zip: checked against the MD5
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("ml-1m/ratings.dat", "".join(lines))
    raw, inter, split = tmp_path / "raw", tmp_path / "interactions", tmp_path / "split"
    assert cli("download", "--dataset", "ml-1m", "--source", archive, "--output", raw)[0] == 0
    assert cli("preprocess", "--input", raw, "--output", inter)[0] == 0
    assert cli("split", "--input", inter, "--output", split)[0] == 0
    paths = write_inputs(tmp_path)
    code, _, err = cli("report", "--output", tmp_path / "report", "--metrics", paths["metrics"],
                       "--manifests", raw, inter, split)
    assert code == 0, err
    accuracy = json.loads((tmp_path / "report" / "report.json").read_text())["accuracy"]
    described = (f"a MovieLens-layout ratings file (ratings.dat; {len(lines)} ratings of 60 "
                 "users x 20 items; not a checksum-verified GroupLens release, though "
                 "--dataset was ml-1m)")
    assert (accuracy["dataset"], accuracy["dataset_name"]) == ("ml-1m", described)
    assert (accuracy["layout"], accuracy["protocol"]) == ("ratings.dat", "mission")
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert f"The data is {described}; the paper published numbers for ML-20M" in markdown
    assert "% of paper" not in markdown and "The data is ML-" not in markdown
    assert "The model is within noise of the ease baseline" not in markdown  # z = -3.2
    assert "The model is worse than the ease baseline" in markdown
