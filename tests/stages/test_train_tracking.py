"""``vaecf train --tensorboard-dir``: event files TensorBoard reads back, local and on S3, and
the metrics line Katib's default StdOut collector parses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import boto3
import pytest

from vaecf.train.tracking import EpochTracker, metrics_line

# Katib v0.19's default StdOut filter (pkg/metricscollector/v1beta1/common/const.go).
KATIB_DEFAULT_FILTER = re.compile(r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)")
SMALL = ["--batch-size", "100", "--hidden", "32", "--latent", "8", "--epochs", "3"]


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files in ``logdir``, read back by TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import (
        TENSORS,
        EventAccumulator,
    )
    from tensorflow import make_ndarray

    events = EventAccumulator(str(logdir), size_guidance={TENSORS: 0})
    events.Reload()
    return {tag: [(e.step, float(make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]
            for tag in events.Tags()["tensors"]}


def katib_metrics(stdout: str) -> list[tuple[str, float]]:
    """(name, value) pairs as Katib's StdOut collector takes them from each line."""
    return [(m.group(1), float(m.group(2))) for line in stdout.splitlines()
            for m in KATIB_DEFAULT_FILTER.finditer(line) if m.group(2) not in ("", "+", "-")]


def test_metrics_line_satisfies_katibs_default_filter() -> None:
    line = metrics_line({"recall_at_20": 0.25, "recall_at_50": 0.5, "ndcg_at_100": 0.123456789})
    assert katib_metrics(line) == [("ndcg_at_100", 0.123457), ("recall_at_20", 0.25),
                                   ("recall_at_50", 0.5)]


def test_tracker_writes_every_scalar_per_epoch_to_s3(s3_bucket: str, tmp_path: Path) -> None:
    tracker = EpochTracker(f"s3://{s3_bucket}/runs/a/tensorboard")
    for epoch in (1, 2):
        tracker.epoch_end({"epoch": epoch, "loss": 10.0 / epoch, "nll": 9.0, "kl": 1.0,
                           "beta": 0.1 * epoch, "users_per_second": 500.0,
                           "input_share": 0.25, "val": {"ndcg_at_100": 0.1 * epoch}})
    tracker.close()
    s3 = boto3.client("s3")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert len(keys) == 1 and keys[0].startswith("runs/a/tensorboard/events.out.tfevents.")
    s3.download_file(s3_bucket, keys[0], str(tmp_path / Path(keys[0]).name))
    found = scalars(tmp_path)
    assert found["train/loss"] == [(1, 10.0), (2, 5.0)]
    assert found["val/ndcg_at_100"] == [(1, pytest.approx(0.1)), (2, pytest.approx(0.2))]
    assert set(found) == {"train/loss", "train/nll", "train/kl", "train/beta",
                          "speed/users_per_second", "speed/input_share", "val/ndcg_at_100"}


def test_train_writes_tensorboard_and_katib_lines(synthetic_split, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                  cli) -> None:
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    code, out, err = cli("train", "--split", split, "--output", tmp_path / "model", *SMALL,
                         "--validate-every", "2", "--tensorboard-dir", tmp_path / "tb")
    assert code == 0, err
    log = [json.loads(line) for line in
           (tmp_path / "model" / "train_log.jsonl").read_text().splitlines()]
    found = scalars(tmp_path / "tb")
    for key, tag in (("loss", "train/loss"), ("kl", "train/kl"), ("beta", "train/beta"),
                     ("users_per_second", "speed/users_per_second"),
                     ("input_share", "speed/input_share"), ("nll", "train/nll")):
        assert found[tag] == [(r["epoch"], pytest.approx(r[key], rel=1e-6)) for r in log]
    validated = [r for r in log if "val" in r]
    assert [r["epoch"] for r in validated] == [2, 3]
    assert found["val/ndcg_at_100"] == [(r["epoch"], pytest.approx(r["val"]["ndcg_at_100"]))
                                        for r in validated]
    ndcg = [value for name, value in katib_metrics(out) if name == "ndcg_at_100"]
    assert ndcg == [pytest.approx(r["val"]["ndcg_at_100"], abs=1e-6) for r in validated]
