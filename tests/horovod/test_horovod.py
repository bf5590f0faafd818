"""``vaecf train`` under a real ``horovodrun -np 2 --gloo`` (two processes on loopback)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from vaecf.cli import main

pytestmark = [pytest.mark.horovod, pytest.mark.slow]

BIN = Path(sys.executable).parent
FLAGS = ["--batch-size", "100", "--hidden", "64", "--latent", "16", "--anneal-steps", "200"]


def horovodrun(split: Path, output: Path, *flags: str,
               ranks: int = 2) -> subprocess.Popen[str]:
    command = [str(BIN / "horovodrun"), "-np", str(ranks), "--gloo", str(BIN / "vaecf"), "train",
               "--split", str(split), "--output", str(output), *FLAGS, *flags]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)


def finish(process: subprocess.Popen[str], timeout: float = 300) -> tuple[int, str]:
    out, _ = process.communicate(timeout=timeout)
    return process.returncode, out


def losses(output: Path) -> list[float]:
    lines = (output / "train_log.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def test_two_ranks_each_reading_its_share_match_one_process_of_two_shares(
        synthetic_split, tmp_path: Path) -> None:
    """Each rank loads only its share of the training pairs (at most half of them, plus
    the row groups' edges, as the manifest records from what each rank loaded), and the
    two ranks' steps equal one process training the same batches (``--user-shares 2``)."""
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    code, out = finish(horovodrun(split, tmp_path / "two", "--epochs", "3",
                                  "--expect-world-size", "2", "--expect-hosts", "1"))
    assert code == 0, out[-3000:]
    assert main(["train", "--split", str(split), "--output", str(tmp_path / "one"),
                 "--epochs", "3", "--user-shares", "2", *FLAGS]) == 0
    np.testing.assert_allclose(losses(tmp_path / "two"), losses(tmp_path / "one"), rtol=1e-5)
    manifest = json.loads((tmp_path / "two" / "train_manifest.json").read_text())
    assert manifest["world_size"] == 2
    made = json.loads((split / "dataset_manifest.json").read_text())
    nnz, groups = made["counts"]["pairs"]["train"], made["train_row_groups"]
    assert len(groups) >= 8  # each rank can read a part of the file
    shares = manifest["counts"]["train_share"]
    users = manifest["counts"]["train_users"]
    assert [s["users"] for s in shares] == [[0, users // 2], [users // 2, users]]
    assert sum(s["pairs"] for s in shares) == nnz
    for share in shares:
        assert share["pairs"] <= nnz / 2 * 1.1, share
        assert share["pairs"] <= share["pairs_read"] <= share["pairs"] + 2 * 1024, share
    one = json.loads((tmp_path / "one" / "train_manifest.json").read_text())
    assert one["counts"]["train_share"] == [{"users": [0, users], "pairs": nnz,
                                             "pairs_read": nnz}]
    digests = manifest["replica_weight_sha256"]
    assert len(digests) == 2 and digests[0] == digests[1]  # identical weights on both ranks
    ends = [np.load(tmp_path / f"{name}-checkpoints" / "epoch-000003" / "state.npz")
            for name in ("two", "one")]
    for key in (k for k in ends[1].files if k.startswith("model/")):
        np.testing.assert_allclose(ends[0][key], ends[1][key], rtol=1e-4, atol=1e-5,
                                   err_msg=key)


RECVAE = ["--kl-per-item", "0.005", "--composite-prior", "--alternate", "1",
          "--encoder-layers", "3", "--implicit-slim-every", "2"]


@pytest.mark.timeout(1200)  # its horovodrun alone may take the 900 s it is given (below)
@pytest.mark.parametrize("shard", [False, True], ids=["replicated", "shard-items"])
def test_every_training_option_on_two_ranks_matches_one_process(synthetic_split, tmp_path: Path,
                                                                shard: bool) -> None:
    """RecVAE's options and ImplicitSLIM's step together, on two ranks (with the items
    sharded, its closed form by shard), each holding its share of the users, as one process
    training the same batches: the same losses, validation and exported model."""
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    flags = ["--epochs", "2", *RECVAE]
    # two traced steps (encoder and decoder passes) per rank: 5 minutes was not enough on a
    # host loaded 17 by other jobs (the first step alone took 134 s)
    code, out = finish(horovodrun(split, tmp_path / "two", *flags,
                                  *(["--shard-items"] if shard else [])), timeout=900)
    assert code == 0, out[-3000:]
    assert main(["train", "--split", str(split), "--output", str(tmp_path / "one"), *flags,
                 "--user-shares", "2", *FLAGS]) == 0  # the two ranks' batches, in one
    np.testing.assert_allclose(losses(tmp_path / "two"), losses(tmp_path / "one"), rtol=1e-4)
    vals = [[json.loads(line)["val"]["ndcg_at_100"] for line in
             (tmp_path / name / "train_log.jsonl").read_text().splitlines()]
            for name in ("two", "one")]
    np.testing.assert_allclose(vals[0], vals[1], rtol=1e-4)
    assert main(["evaluate", "--split", str(split), "--model", str(tmp_path / "two"),
                 "--output", str(tmp_path / "eval")]) == 0


def rank_process(launcher: subprocess.Popen[str], rank: int) -> psutil.Process | None:
    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if (child.environ().get("HOROVOD_RANK") == str(rank)
                    and "train" in child.cmdline()):
                return child
        except psutil.Error:
            continue
    return None


def test_rank_killed_mid_epoch_then_rerun_resumes(synthetic_split, tmp_path: Path) -> None:
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    checkpoints = tmp_path / "model-checkpoints"
    flags = ("--epochs", "4", "--steps-per-epoch", "300", "--validate-every", "4",
             "--checkpoint-every", "1")  # the previous default: a checkpoint per epoch
    launcher = horovodrun(split, tmp_path / "model", *flags)
    deadline = time.monotonic() + 240
    while not (checkpoints / "epoch-000001").is_dir():
        assert launcher.poll() is None and time.monotonic() < deadline, "no checkpoint"
        time.sleep(0.2)
    victim = rank_process(launcher, 1)
    assert victim is not None
    victim.send_signal(signal.SIGKILL)
    code, out = finish(launcher)
    assert code != 0, out[-3000:]
    assert not (tmp_path / "model").exists()
    kept = sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("epoch-"))
    assert kept and kept[-1] != "epoch-000004"
    code, out = finish(horovodrun(split, tmp_path / "model", *flags))
    assert code == 0, out[-3000:]
    assert f"resuming from checkpoint {kept[-1]}" in out
    log = [json.loads(line) for line in
           (tmp_path / "model" / "train_log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in log] == [1, 2, 3, 4]
    assert [r["step"] for r in log] == [300, 600, 900, 1200]


def test_wrong_expected_world_size_fails_on_every_rank(synthetic_split, tmp_path: Path) -> None:
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    code, out = finish(horovodrun(split, tmp_path / "model", "--expect-world-size", "3"))
    assert code != 0
    assert ("vaecf train: error: --expect-world-size 3: this job has 2 process(es)" in out)
    assert not (tmp_path / "model").exists()


def test_shard_items_trains_resumes_by_shard_and_exports_the_whole_model(
        synthetic_split, tmp_path: Path) -> None:
    """``--shard-items`` end to end on 2 ranks: each rank checkpoints its shard, a rerun
    resumes from them on the same trajectory, and rank 0 exports one whole model that
    ``vaecf evaluate`` scores. (Before every rank stepped on one batch shape, the ranks traced
    the step at different steps and hung in step 2.)"""
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    flags = ["--shard-items", "--checkpoint-dir", str(tmp_path / "ck")]
    code, out = finish(horovodrun(split, tmp_path / "two", "--epochs", "2", *flags))
    assert code == 0, out[-3000:]
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["shard-0", "shard-1"]
    code, out = finish(horovodrun(split, tmp_path / "three", "--epochs", "3", *flags))
    assert code == 0, out[-3000:]
    assert "resuming from checkpoint epoch-000002" in out
    assert "epoch 3: loss" in out and "epoch 1: loss" not in out  # only epoch 3 trained
    assert len(losses(tmp_path / "three")) == 3
    manifest = json.loads((tmp_path / "three" / "train_manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["n_items"] == 300
    assert main(["evaluate", "--split", str(split), "--model", str(tmp_path / "three"),
                 "--output", str(tmp_path / "eval")]) == 0
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert 0.0 < metrics["ndcg_at_100"]["mean"] <= 1.0
    # the shards of 2 ranks are not resumed by 3 (the last flag wins: batch 102 = 3 x 34)
    code, out = finish(horovodrun(split, tmp_path / "four", "--epochs", "4", *flags,
                                  "--batch-size", "102", ranks=3))
    assert code != 0 and "shards written by 2 process(es), this job has 3" in out
    assert not (tmp_path / "four").exists()


def test_shard_items_in_one_process_is_refused(synthetic_split, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    code = main(["train", "--split", str(split), "--output", str(tmp_path / "model"),
                 "--shard-items", *FLAGS])
    err = capsys.readouterr().err
    assert code != 0 and "--shard-items: this job has 1 process" in err
    assert not (tmp_path / "model").exists()
    code = main(["train", "--split", str(split), "--output", str(tmp_path / "model"),
                 "--shard-items", "--xla", *FLAGS])
    assert code != 0 and "XLA cannot compile" in capsys.readouterr().err


def saved_variables(output: Path) -> dict[str, np.ndarray]:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(output / "saved_model" / "variables" / "variables"))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if "OPTIMIZER" not in name and not name.startswith("_CHECKPOINTABLE")}


def test_shard_items_trains_the_model_the_data_parallel_run_trains(synthetic_split,
                                                                   tmp_path: Path) -> None:
    """The whole stage, not one step: ``--shard-items`` on 2 ranks starts from the whole
    model's slices (item weights are drawn per item), so its losses, validation and exported
    model equal the data-parallel run's, to float32 rounding of sums taken in another order
    (1e-5 relative on losses). EASE is never blended under --shard-items: the data-parallel
    run leaves it out too, so the two exports hold the same variables."""
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    runs = {}
    for name, flags in (("whole", ["--ease-blend", "off"]), ("sharded", ["--shard-items"])):
        code, out = finish(horovodrun(split, tmp_path / name, "--epochs", "3",
                                      "--validate-every", "1", *flags))
        assert code == 0, out[-3000:]
        runs[name] = [json.loads(line) for line in
                      (tmp_path / name / "train_log.jsonl").read_text().splitlines()]
    whole, sharded = runs["whole"], runs["sharded"]
    assert [r["shard_items"] for r in sharded] == [True] * 3
    np.testing.assert_allclose([r["loss"] for r in sharded], [r["loss"] for r in whole],
                               rtol=1e-5)
    for key in ("recall_at_20", "ndcg_at_100"):
        np.testing.assert_allclose([r["val"][key] for r in sharded],
                                   [r["val"][key] for r in whole], atol=1e-5, err_msg=key)
    ours, theirs = saved_variables(tmp_path / "sharded"), saved_variables(tmp_path / "whole")
    assert ours.keys() == theirs.keys() and len(ours) >= 8
    for name, value in theirs.items():
        if value.dtype == object:  # the raw item ids
            assert ours[name].tolist() == value.tolist(), name
        else:
            # Adam divides by the root of the squared gradient: a weight whose gradients are
            # near zero moves by a rounding's share of a whole step (lr 1e-3), seen 2.3e-6
            np.testing.assert_allclose(ours[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


def test_shard_items_weights_do_not_depend_on_the_steps_per_call(synthetic_split,
                                                                 tmp_path: Path) -> None:
    """Two ranks with item shards (collectives inside the loop's every step, the replicated
    gradients in one grouped allreduce) after two epochs of one step per call and of the
    chosen counts (1, 2, 4, ... then measured): every rank's shard, bit for bit."""
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    for name, per_call in (("one", "1"), ("chosen", "0")):
        code, out = finish(horovodrun(split, tmp_path / name, "--epochs", "2", "--hidden",
                                      "32", "--encoder-layers", "1", "--shard-items",
                                      "--steps-per-call", per_call))
        assert code == 0, out[-3000:]
    for shard in ("shard-0", "shard-1"):
        ends = [np.load(tmp_path / f"{name}-checkpoints" / shard / "epoch-000002" / "state.npz")
                for name in ("one", "chosen")]
        keys = [k for k in ends[0].files if k.startswith(("model/", "optimizer/"))]
        assert len(keys) >= 8 and keys == [k for k in ends[1].files if k in keys]
        for key in keys:
            assert np.array_equal(ends[0][key], ends[1][key]), (shard, key)
