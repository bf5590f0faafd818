"""Report library: benchmark arithmetic, accuracy verdict, formatting, input checks.

Expectations are computed by hand in the comments.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vaecf.errors import VaecfError
from vaecf.report import accuracy, benchstats, data_identity, speed
from vaecf.report.document import Section, Table, fmt, fmt_count, to_html, to_markdown
from vaecf.report.inputs import read_benchmark, read_metrics, read_train_log
from vaecf.train.tracking import VAL_KEYS
from vaecf.tuning.trials import read_trials

LOG = [
    {"epoch": 1, "step": 10, "epoch_seconds": 5.0, "users_per_second": 100.0,
     "input_seconds": 1.0},
    {"epoch": 2, "step": 20, "epoch_seconds": 2.0, "users_per_second": 500.0,
     "input_seconds": 0.5},
    {"epoch": 3, "step": 30, "epoch_seconds": 3.0, "users_per_second": 400.0,
     "input_seconds": 0.25, "val": {"ndcg_at_100": 0.3}},
]


def test_run_stats_excludes_the_warmup_epoch() -> None:
    stats = benchstats.run_stats(LOG, warmup_epochs=1, target_ndcg=0.3)
    # measured: 2 s + 3 s = 5 s; users 500*2 + 400*3 = 2200; steps 30 - 10 = 20
    assert stats["users_per_second"] == pytest.approx(440.0)
    assert stats["steps_per_second"] == pytest.approx(4.0)
    assert stats["epoch_seconds"] == pytest.approx(2.5)
    assert stats["input_share"] == pytest.approx(0.15)  # (0.5 + 0.25) / 5
    assert stats["train_seconds"] == pytest.approx(10.0)
    assert stats["time_to_target_seconds"] == pytest.approx(10.0)  # warm-up counts
    assert benchstats.run_stats(LOG, 1, target_ndcg=0.31)["time_to_target_seconds"] is None


def test_run_stats_needs_an_epoch_after_the_warmup() -> None:
    with pytest.raises(ValueError, match="warm-up"):
        benchstats.run_stats(LOG[:1], warmup_epochs=1)


def test_flops_per_user_follows_the_documented_formula() -> None:
    # 2*50*600 + 2*600*400 + 2*200*600 + 2*600*1000 = 1,980,000 forward; x3
    assert benchstats.flops_per_user(1000, 600, 200, 50.0) == pytest.approx(5_940_000.0)


def _run(precision: str, world_size: int, users: float, status: str = "ok") -> dict:
    return {"precision": precision, "world_size": world_size, "batch_size": 500,
            "status": status, "users_per_second": users, "steps_per_second": users / 500,
            "epoch_seconds": 1.0, "input_share": 0.1, "time_to_target_seconds": None,
            "bound_fraction": 0.5}


def test_summarize_gives_min_and_median_of_successful_repeats() -> None:
    runs = [_run("fp32", 1, 10.0), _run("fp32", 1, 30.0), _run("fp32", 1, 99.0, "failed")]
    (config,) = benchstats.summarize(runs)
    assert (config["repeats"], config["runs_ok"]) == (3, 2)
    assert config["users_per_second"] == {"min": 10.0, "median": 20.0}
    assert config["time_to_target_seconds"] is None


def test_the_benchmark_table_shows_each_configurations_peak_memory() -> None:
    from vaecf.report import speed_render

    runs = [_run("fp32", 2, 10.0) | {"shard_items": shard, "peak_rss_bytes": rss}
            for shard, rss in ((False, 5.6e9), (True, 2.66e9))]
    speed_doc = {"configs": benchstats.summarize(runs)}
    (table, *_) = speed_render._config_blocks(speed_doc)
    column = table.columns.index("peak memory GB (largest rank)")
    assert [row[column] for row in table.rows] == ["5.60 (5.60)", "2.66 (2.66)"]


def test_speedups_and_scaling_use_medians() -> None:
    configs = benchstats.summarize([_run("fp32", 1, 100.0), _run("mixed_bfloat16", 1, 150.0),
                                    _run("fp32", 2, 160.0)])
    (mixed,) = speed.precision_speedups(configs)
    assert mixed["speedup"] == pytest.approx(1.5)
    two = [s for s in speed.scaling(configs) if s["world_size"] == 2]
    assert two[0]["speedup"] == pytest.approx(1.6)
    assert two[0]["efficiency"] == pytest.approx(0.8)
    reference = {"configs": benchstats.summarize([_run("fp32", 1, 80.0)])}
    (versus,) = speed.versus_reference(configs, reference)
    assert versus["ratio"] == pytest.approx(1.25)


def _metrics(ndcg: float, stderr: float) -> dict:
    m = {"mean": 0.3, "stderr": 0.001}
    return {"recall_at_20": m, "recall_at_50": m, "ndcg_at_100": {"mean": ndcg,
                                                                  "stderr": stderr}}


PAPER_PREPROCESS = {"protocol": "paper", "min_rating": 4.0, "min_user_items": 5,
                    "min_item_users": 0, "k_core": False}


def _paper_run(dataset: str, heldout_users: int) -> dict[str, dict]:
    """Manifests as the data stages write them for ``dataset`` under ``--protocol paper``."""
    verified = dataset if dataset.startswith("ml-") else None
    return {"download": {"dataset": dataset, "verified_release": verified},
            "preprocess": {"dataset": dataset, "parameters": PAPER_PREPROCESS},
            "dataset": {"dataset": dataset, "parameters": {
                "protocol": "paper", "heldout_users": heldout_users, "holdout_fraction": 0.2}}}


def _paired(delta: float, stderr: float, users: int = 4000) -> dict:
    test = {"test": "paired z-test on per-user differences", "users": users,
            "delta": delta, "stderr": stderr, "z": delta / stderr}
    return {"recall_at_20": test, "recall_at_50": test, "ndcg_at_100": test}


def test_accuracy_verdict_against_paper_and_baselines() -> None:
    metrics = _metrics(0.41, 0.002) | {"baselines": {
        "ease": _metrics(0.413, 0.002) | {"paired": _paired(-0.003, 0.002)},
        "popularity": _metrics(0.2, 0.002) | {"paired": _paired(0.21, 0.003)},
        "worse": _metrics(0.5, 0.002) | {"paired": _paired(-0.09, 0.002)}}}
    acc = accuracy.analyse(metrics, _paper_run("ml-20m", 10_000))
    assert acc["comparable_to_paper"] and acc["dataset_name"] == "ML-20M"
    lines = accuracy.verdict(acc)
    # 0.41 / 0.426 = 96.2%: close; 0.41 + 2 * 0.002 < 0.426
    assert lines[0].startswith("Accuracy is close to the paper") and "96.2%" in lines[0]
    assert "The data is ML-20M under the paper's protocol" in lines[0]
    # paired: z = -0.003 / 0.002 = -1.5, |z| <= 2: noise
    assert "The model is within noise of the ease baseline" in lines[1]
    assert "paired z-test on per-user differences over 4,000 users: z = -1.50" in lines[1]
    assert "The model beats the popularity baseline" in lines[2] and "+0.2100" in lines[2]
    assert "The model is worse than the worse baseline" in lines[3]
    table = accuracy.section(acc).blocks[2]
    assert table.columns[3:5] == ["paper (ML-20M)", "% of paper"]


def test_a_paired_difference_is_significant_where_unpaired_errors_say_noise() -> None:
    # -0.036 with unpaired stderrs 0.02 each: |d| < 2 * sqrt(2) * 0.02 = 0.057 looked like
    # noise; paired on the same users the stderr is 0.006: z = -6, significantly worse.
    metrics = _metrics(0.30, 0.02) | {"baselines": {
        "ease": _metrics(0.336, 0.02) | {"paired": _paired(-0.036, 0.006)}}}
    line = accuracy.verdict(accuracy.analyse(metrics, {}))[1]
    assert line.startswith("The model is worse than the ease baseline on NDCG@100")
    assert "z = -6.00" in line


def test_without_a_paired_comparison_a_baseline_difference_is_not_judged() -> None:
    metrics = _metrics(0.30, 0.02) | {"baselines": {"ease": _metrics(0.336, 0.02)}}
    line = accuracy.verdict(accuracy.analyse(metrics, {}))[1]
    assert "not judged" in line and "within noise" not in line and "worse" not in line


def test_accuracy_section_says_when_there_is_no_steady_rate() -> None:
    timing = {"process_seconds_before_stage": 3.0, "load_seconds": 1.0,
              "first_chunk_seconds": 0.5, "first_chunk_users": 900, "startup_seconds": 4.5,
              "users_per_second": None,
              "steady_rate": "none: 900 users make no whole chunk after the first"}
    acc = accuracy.analyse(_metrics(0.41, 0.002) | {"timing": timing, "device": "cpu"},
                           _paper_run("ml-20m", 10_000))
    (speed,) = [b for b in accuracy.section(acc).blocks
                if isinstance(b, str) and b.startswith("Evaluation speed")]
    assert speed.startswith("Evaluation speed on cpu: no steady rate (none: 900 users make no "
                            "whole chunk after the first) after a start-up of 4.50 s")


def test_netflix_under_the_paper_protocol_is_compared_with_netflix_numbers() -> None:
    acc = accuracy.analyse(_metrics(0.386, 0.001), _paper_run("netflix", 40_000))
    assert acc["comparable_to_paper"] and acc["dataset_name"] == "Netflix Prize"
    assert acc["metrics"]["ndcg_at_100"]["paper"] == 0.386  # Table 2, Netflix, Mult-VAE
    assert accuracy.verdict(acc)[0].startswith("Accuracy matches or beats the paper")


def test_accuracy_on_other_data_names_it_and_shows_no_paper_numbers() -> None:
    acc = accuracy.analyse(_metrics(0.43, 0.001), {
        "download": {"dataset": "ml-1m", "verified_release": "ml-1m"},
        "preprocess": {"dataset": "ml-1m"}})
    assert not acc["comparable_to_paper"] and acc["dataset_name"] == "ML-1M"
    first = accuracy.verdict(acc)[0]  # 0.43 would "beat" 0.426 if the data were ML-20M
    assert first.startswith("Accuracy: NDCG@100 0.4300 ± 0.0010. The data is ML-1M;")
    assert "beats" not in first and "%" not in first and "0.426" not in first
    assert "ratio_to_paper" not in acc["metrics"]["ndcg_at_100"]
    assert "% of paper" not in accuracy.section(acc).blocks[2].columns


def test_an_unverified_release_is_described_not_named() -> None:
    """--dataset ml-20m on a 718-user ratings file: no published checksum matched."""
    manifests = _paper_run("ml-20m", 10_000)
    manifests["download"]["verified_release"] = None
    manifests["preprocess"] |= {"layout": "ratings.csv",
                                "counts": {"raw": {"rows": 81_000, "users": 718, "items": 9_000}}}
    acc = accuracy.analyse(_metrics(0.43, 0.001), manifests)
    assert not acc["comparable_to_paper"] and acc["release"] is None
    assert acc["dataset_name"] == (
        "a MovieLens-layout ratings file (ratings.csv; 81,000 ratings of 718 users x 9,000 "
        "items; not a checksum-verified GroupLens release, though --dataset was ml-20m)")
    first = accuracy.verdict(acc)[0]
    assert "The data is ML-20M" not in first and "The data is a MovieLens-layout" in first


@pytest.mark.parametrize(("dataset", "name"), [
    ("ml-100k", "ML-100K"), ("ml-latest-small", "ML-latest-small"), ("ml-64m", "ML-64M"),
    ("netflix", "Netflix Prize"), ("table", "a table of interactions (your own data)"),
    ("some-new-data", "some-new-data")])
def test_display_names(dataset: str, name: str) -> None:
    assert data_identity.display_name(dataset) == name


@pytest.mark.parametrize(("stage", "change", "reason"), [
    ("preprocess", {"protocol": "mission", "min_item_users": 5}, "preprocess protocol 'mission'"),
    ("preprocess", {"min_rating": 3.0}, "--min-rating 3.0, the paper's is 4.0"),
    ("preprocess", {"k_core": True}, "--k-core True, the paper's is False"),
    ("dataset", {"heldout_users": 500}, "--heldout-users 500, the paper's is 10,000"),
    ("dataset", {"protocol": None}, "split protocol not recorded")])
def test_ml20m_off_the_paper_protocol_is_not_compared(stage: str, change: dict,
                                                       reason: str) -> None:
    manifests = _paper_run("ml-20m", 10_000)
    manifests[stage]["parameters"] = manifests[stage]["parameters"] | change
    acc = accuracy.analyse(_metrics(0.41, 0.002), manifests)
    assert not acc["comparable_to_paper"]
    assert "not under the paper's protocol" in acc["note"] and reason in acc["note"]
    assert "%" not in accuracy.verdict(acc)[0]


def test_unrecorded_dataset_is_not_compared() -> None:
    acc = accuracy.analyse(_metrics(0.43, 0.001), {})
    assert not acc["comparable_to_paper"] and "not recorded" in acc["note"]


def test_formatting() -> None:
    assert fmt(0.41234) == "0.4123"
    assert fmt(1234.56, 1) == "1,234.6"
    assert fmt(None) == "-"
    assert fmt_count(136677) == "136,677"


def test_markdown_and_html_show_the_same_cells() -> None:
    sections = [Section("S", ["a <b> & c", ["item"], Table(["k", "v"], [["x|y", "1.5"]])])]
    markdown = to_markdown("T", sections)
    assert "| x\\|y | 1.5 |" in markdown and "- item" in markdown
    page = to_html("T", sections)
    assert "a &lt;b&gt; &amp; c" in page and '<td>x|y</td><td class="num">1.5</td>' in page


def test_malformed_inputs_name_the_file_and_line(tmp_path: Path) -> None:
    log = tmp_path / "train_log.jsonl"
    log.write_text(json.dumps({"epoch": 1, "loss": 1.0, "kl": 0.1, "beta": 0.0,
                               "epoch_seconds": 1.0, "users_per_second": 5.0}) + "\n{oops\n")
    with pytest.raises(VaecfError, match=r"train_log.jsonl: line 2: not valid JSON"):
        read_train_log(str(log))
    log.write_text(json.dumps({"epoch": 1, "loss": "nan?"}) + "\n")
    with pytest.raises(VaecfError, match=r"line 1: missing or non-numeric loss, kl"):
        read_train_log(str(log))
    trials = tmp_path / "trials.jsonl"
    trial = {"trial": 0, "params": {}, "val": {k: 0.1 for k in VAL_KEYS}}
    trials.write_text(json.dumps(trial) + "\n\n{oops\n")  # a blank line is skipped
    with pytest.raises(VaecfError, match=r"trials.jsonl: line 3: not valid JSON"):
        read_trials(str(trials))
    trials.write_text(json.dumps(trial) + "\n" + json.dumps({"params": {}}) + "\n")
    with pytest.raises(VaecfError, match=r"trials.jsonl: line 2: expected a trial with"):
        read_trials(str(trials))
    trials.write_text("\n")
    with pytest.raises(VaecfError, match=r"trials.jsonl: no trials"):
        read_trials(str(trials))
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps(_metrics(0.4, 0.1) | {"baselines": {"ease": {}}}))
    with pytest.raises(VaecfError, match=r"metrics.json: baselines.ease: 'recall_at_20'"):
        read_metrics(str(metrics))
    bench = tmp_path / "benchmark.json"
    bench.write_text(json.dumps({"runs": [], "configs": [{"precision": "fp32"}]}))
    with pytest.raises(VaecfError, match=r"benchmark.json: configs\[0\] needs"):
        read_benchmark(str(bench))
    with pytest.raises(VaecfError, match=r"absent.json: input file does not exist"):
        read_metrics(str(tmp_path / "absent.json"))


def test_a_busy_host_is_flagged_beyond_the_benchmarks_own_ranks() -> None:
    machine = {"cpu_cores_usable": 2, "load_average": [3.5, 1.0, 1.0],
               "load_average_end": [4.5, 2.0, 1.0]}
    # 2 cores + 2 ranks of its own: a load of 4.5 means others were running
    assert speed.host_load(machine, own=2) == {"load": 4.5, "cores": 2, "busy": True}
    assert not speed.host_load(machine, own=3)["busy"]
    assert speed.host_load({}, own=1) is None
