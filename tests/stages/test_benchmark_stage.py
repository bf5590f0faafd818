"""``vaecf benchmark``: real ``vaecf train`` runs (one process and ``horovodrun -np 2``) on a
tiny synthetic split produce ``benchmark.json``, and the report renders it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vaecf.cli import build_parser
from vaecf.train.benchmark import BenchmarkConfig, train_command

RUN_FIELDS = {"precision", "world_size", "batch_size", "repeat", "status", "users_per_second",
              "steps_per_second", "epoch_seconds", "input_share", "time_to_target_seconds",
              "bound_fraction", "bound_users_per_second", "measured_epochs", "measured_steps",
              "lr_scaling", "learning_rate", "epochs_to_target", "shard_items", "peak_rss_bytes",
              "peak_rss_bytes_per_rank"}


def _config(**changes: object) -> BenchmarkConfig:
    values: dict[str, object] = dict(
        split=None, precisions=("fp32",), world_sizes=(1,), batch_sizes=(64,), steps=3,
        epochs=None, repeats=1, target_ndcg=None, synthetic_users=300, synthetic_items=150,
        seed=0)
    values.update(changes)
    return BenchmarkConfig(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("changes", [{}, {"steps": None, "epochs": 2, "target_ndcg": 0.1},
                                     {"xla": True}, {"shard_items": True}])
def test_train_command_uses_flags_train_accepts(tmp_path: Path, changes: dict) -> None:
    command = train_command(_config(**changes), tmp_path / "split", tmp_path / "run",
                            "mixed_bfloat16", 2, 64, "none", bool(changes.get("shard_items")))
    assert command[:4] == [str(Path(command[4]).parent / "horovodrun"), "-np", "2", "--gloo"]
    args = build_parser("train").parse_args(command[command.index("train") + 1:])
    assert (args.precision, args.batch_size, args.expect_world_size) == ("mixed_bfloat16", 64, 2)
    assert args.xla == bool(changes.get("xla"))
    assert args.shard_items == bool(changes.get("shard_items"))
    if changes.get("epochs"):  # one warm-up + 2 measured epochs, validated every epoch
        assert (args.epochs, args.validate_every, args.steps_per_epoch) == (3, 1, None)
    else:  # one warm-up epoch + one measured epoch of 3 steps
        assert (args.epochs, args.steps_per_epoch) == (2, 3)


def test_training_options_reach_train_as_its_flags(tmp_path: Path) -> None:
    from vaecf.train.benchmark import TRAINING_OPTIONS

    options = tuple(name for name in TRAINING_OPTIONS if name != "one-layer-encoder")
    command = train_command(_config(training_options=options),
                            tmp_path / "split", tmp_path / "run", "fp32", 1, 64)
    args = build_parser("train").parse_args(command[command.index("train") + 1:])
    assert (args.kl_per_item, args.composite_prior, args.alternate, args.encoder_layers,
            args.implicit_slim_every) == (0.005, True, 3, 5, 1)
    plain = build_parser("train").parse_args(train_command(
        _config(training_options=("one-layer-encoder",)), tmp_path / "s", tmp_path / "r",
        "fp32", 1, 64)[4:])
    assert (plain.kl_per_item, plain.composite_prior, plain.alternate, plain.encoder_layers,
            plain.implicit_slim_every) == (None, False, 0, 1, 0)


@pytest.mark.parametrize(("batch", "rule", "lr"), [(4000, "none", 5e-4), (4000, "sqrt", 1.41421e-3),
                                                   (4000, "linear", 4e-3), (250, "linear", 2.5e-4)])
def test_each_run_scales_its_learning_rate_with_the_global_batch(tmp_path: Path, batch: int,
                                                                 rule: str, lr: float) -> None:
    # train's 5e-4 at 500 users per step (one device), scaled by rule: sqrt(8) = 2.828427...
    config = _config(lr_scalings=("none", "sqrt", "linear"))
    command = train_command(config, tmp_path / "split", tmp_path / "run", "fp32", 2, batch, rule)
    args = build_parser("train").parse_args(command[command.index("train") + 1:])
    assert (args.batch_size, args.learning_rate) == (batch, lr)


def test_lr_scaling_refuses_an_unknown_rule() -> None:
    from vaecf.train.scaling import scaled_learning_rate

    with pytest.raises(ValueError, match="unknown learning-rate scaling 'cubic'"):
        scaled_learning_rate(1000, "cubic")
    with pytest.raises(ValueError, match="global batch must be >= 1"):
        scaled_learning_rate(0, "none")


@pytest.mark.slow
@pytest.mark.horovod
def test_benchmark_runs_the_trainer_and_the_report_renders_it(cli, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    code, _, err = cli("benchmark", "--output", out, "--precisions", "fp32",
                       "--world-sizes", "1", "2", "--batch-sizes", "64", "--epochs", "1",
                       "--target-ndcg", "0.0", "--synthetic-users", "400",
                       "--synthetic-items", "150", "--item-layouts", "whole", "sharded",
                       "--hidden", "48", "--latent", "12")
    assert code == 0, err
    bench = json.loads((out / "benchmark.json").read_text())
    assert [(r["world_size"], r["shard_items"], r["status"]) for r in bench["runs"]] == [
        (1, False, "ok"), (2, False, "ok"), (2, True, "ok")], (
        [r.get("error") for r in bench["runs"]])  # sharding needs 2 ranks: no (1, True)
    steps = -(-bench["split"]["n_users"]["train"] // 64)  # one pass over the train users
    for run in bench["runs"]:
        assert set(run) >= RUN_FIELDS
        assert run["device"] == bench["fingerprint"]["device"]
        assert run["device"].startswith("CPU ")  # this test host has no GPU
        assert run["measured_epochs"] == 1 and run["measured_steps"] == steps
        assert run["users_per_second"] > 0 and 0 <= run["input_share"] <= 1
        assert run["bound_fraction"] == pytest.approx(
            run["users_per_second"] / run["bound_users_per_second"])
        lines = (out / "runs" / run["name"] / "train_log.jsonl").read_text().splitlines()
        log = [json.loads(line) for line in lines]
        assert [e["epoch"] for e in log] == [1, 2]  # warm-up + measured epoch
        assert run["users_per_second"] == pytest.approx(log[1]["users_per_second"])
        # every epoch validated; NDCG@100 >= 0 holds at the first (warm-up included)
        assert run["time_to_target_seconds"] == pytest.approx(log[0]["epoch_seconds"])
        assert run["epochs_to_target"] == 1
        assert (run["lr_scaling"], run["learning_rate"]) == ("none", 5e-4)  # train's rate
        assert len(run["peak_rss_bytes_per_rank"]) == run["world_size"]
        assert (run["hidden"], run["latent"]) == (48, 12)  # the width trained, as recorded
        assert run["peak_rss_bytes"] == max(run["peak_rss_bytes_per_rank"]) > 100 * 2**20
    (single, double, sharded) = bench["configs"]
    assert (double["shard_items"], sharded["shard_items"]) == (False, True)
    assert single["users_per_second"]["median"] == bench["runs"][0]["users_per_second"]
    assert bench["split"]["synthetic"] and bench["split"]["n_items"] <= 150
    assert bench["compute_bound"]["matmul_flops_per_second"]["fp32"] > 0
    assert bench["compute_bound"]["matmul_probe"] == {"size": 2048, "products_per_sync": 1}
    assert {"cpu_model", "cpu_cores", "gpu_count", "tensorflow", "keras", "horovod",
            "cuda"} <= set(bench["fingerprint"])
    assert (out / "benchmark_manifest.json").is_file()

    code, _, err = cli("report", "--output", tmp_path / "report", "--benchmark",
                       out / "benchmark.json")
    assert code == 0, err
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    (scaled,) = [s for s in report["speed"]["scaling"] if s["world_size"] == 2]
    expected = double["users_per_second"]["median"] / single["users_per_second"]["median"]
    assert scaled["speedup"] == pytest.approx(expected)
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert f"{expected:.2f}x" in markdown
    assert f"Device: {bench['runs'][0]['device']}." in markdown


@pytest.mark.slow
@pytest.mark.horovod
def test_every_run_failing_is_an_error_and_writes_nothing(cli, tmp_path: Path,
                                                          synthetic_split) -> None:
    out = tmp_path / "bench"
    # a global batch of 3 cannot be shared by 2 processes: the trainer refuses it
    code, _, err = cli("benchmark", "--split", synthetic_split(), "--output", out,
                       "--precisions", "fp32", "--world-sizes", "2", "--batch-sizes", "3",
                       "--steps", "2")
    assert code == 1
    assert "every benchmark run failed; first: fp32-np2-b3-r0: exit" in err
    assert "--batch-size 3" in err
    assert not out.exists()


def test_a_failed_runs_error_is_the_ranks_exception(tmp_path: Path) -> None:
    from vaecf.train.benchmark import _error_line

    out = tmp_path / "train.out"
    out.write_text("[0]<stdout>:training on 10 users\n[1]<stderr>:Traceback (most recent ...\n"
                   "[1]<stderr>:    RecursionError: maximum recursion depth exceeded\n"
                   "RuntimeError: Horovod detected that one or more processes exited with "
                   "non-zero status\nProcess name: 0\n")
    assert _error_line(out) == "RecursionError: maximum recursion depth exceeded"
    out.write_text("[1]<stderr>:vaecf train: error: --batch-size 3: the global batch must "
                   "divide evenly over 2 processes\nRuntimeError: Horovod detected ...\n")
    assert _error_line(out).startswith("vaecf train: error: --batch-size 3")
