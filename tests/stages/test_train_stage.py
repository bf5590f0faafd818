"""``vaecf train`` end to end on planted synthetic splits (real files, real SavedModels)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from stage_checks import tmpfs

from vaecf.cli import main
from vaecf.data.splits import load_split

SMALL = ["--batch-size", "100", "--hidden", "64", "--latent", "16", "--anneal-steps", "200"]


def train(split: Path, output: Path, *flags: str) -> int:
    return main(["train", "--split", str(split), "--output", str(output), *SMALL, *flags])


def read_log(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "train_log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(synthetic_split, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(split, model): 12 epochs on 2,000 planted users."""
    split = synthetic_split(n_users=2000, n_items=300, seed=0)
    output = tmp_path_factory.mktemp("train") / "model"
    assert train(split, output, "--epochs", "12", "--hidden", "128", "--latent", "32") == 0
    return split, output


def test_loss_decreases_and_val_ndcg_clearly_beats_popularity(trained) -> None:
    from vaecf.baselines.popularity import Popularity
    from vaecf.metrics import evaluate

    split, output = trained
    log = read_log(output)
    assert [r["epoch"] for r in log] == list(range(1, 13))
    assert log[-1]["nll"] < log[0]["nll"] - 5.0
    popularity = evaluate(Popularity(load_split(split).train), *load_split(split).heldout("val"),
                          engine="numpy").metrics["ndcg_at_100"]
    manifest = json.loads((output / "train_manifest.json").read_text())
    best = manifest["best_val"]["ndcg_at_100"]
    assert best == max(r["val"]["ndcg_at_100"] for r in log)
    assert best > popularity.mean + 4 * popularity.stderr, (best, popularity)


def test_output_matches_the_contract(trained) -> None:
    split, output = trained
    record = read_log(output)[0]
    assert set(record) == {"epoch", "step", "loss", "nll", "kl", "beta", "epoch_seconds",
                           "users_per_second", "input_seconds", "input_share",
                           "skipped_steps", "loss_scale", "precision", "world_size",
                           "batch_size", "shard_items", "peak_rss_bytes", "val",
                           "val_stderr"}
    assert record["shard_items"] is False and len(record["peak_rss_bytes"]) == 1
    assert set(record["val"]) == set(record["val_stderr"]) == {"recall_at_20", "recall_at_50",
                                                               "ndcg_at_100"}
    assert 0.0 < record["val_stderr"]["ndcg_at_100"] < 0.1
    assert record["loss_scale"] is None and record["precision"] == "fp32"
    train_users, n_items = load_split(split).train.shape
    assert record["step"] == -(-train_users // 100) and record["world_size"] == 1
    manifest = json.loads((output / "train_manifest.json").read_text())
    assert manifest["n_items"] == manifest["split_n_items"] == n_items
    assert manifest["split_digest"] == load_split(split).digest
    assert manifest["best_epoch"] in range(1, 13)
    assert (output.parent / "model-checkpoints" / "epoch-000012" / "meta.json").is_file()


def test_saved_model_in_a_fresh_process_never_recommends_fold_in_items(trained) -> None:
    split, output = trained
    script = f"""
import numpy as np, tensorflow as tf
from pathlib import Path
from vaecf.data.splits import load_split
fold_in, _ = load_split(Path({str(split)!r})).heldout("val")
model = tf.saved_model.load({str(output / "saved_model")!r})
inputs = dict(row_splits=tf.constant(fold_in.indptr.astype(np.int64)),
              item_idx=tf.constant(fold_in.indices.astype(np.int64)))
scores = model.signatures["score"](**inputs)["scores"].numpy()
top = model.signatures["recommend"](**inputs, k=tf.constant(100, tf.int32))
items, values = top["item_idx"].numpy(), top["scores"].numpy()
assert scores.shape == fold_in.shape and items.shape == (fold_in.shape[0], 100)
for user in range(fold_in.shape[0]):
    own = set(fold_in.indices[fold_in.indptr[user]:fold_in.indptr[user + 1]])
    assert own and not own & set(items[user][np.isfinite(values[user])]), user
    assert np.all(np.diff(values[user]) <= 0)
    np.testing.assert_allclose(values[user][0], np.delete(scores[user], list(own)).max())
print("checked", fold_in.shape[0])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("checked")


def test_resume_after_stopping_equals_uninterrupted(synthetic_split, tmp_path: Path) -> None:
    import tensorflow as tf

    tf.config.experimental.enable_op_determinism()
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    assert train(split, tmp_path / "whole", "--epochs", "4") == 0
    assert train(split, tmp_path / "parts", "--epochs", "2") == 0
    assert train(split, tmp_path / "parts", "--epochs", "4") == 0
    whole, parts = read_log(tmp_path / "whole"), read_log(tmp_path / "parts")
    assert [r["loss"] for r in whole] == [r["loss"] for r in parts]
    end = [np.load(tmp_path / f"{name}-checkpoints" / "epoch-000004" / "state.npz")
           for name in ("whole", "parts")]
    assert sorted(end[0].files) == sorted(end[1].files)
    for key in end[0].files:  # weights, Adam slots and best weights: bit for bit
        np.testing.assert_array_equal(end[0][key], end[1][key], err_msg=key)
    # The exported variables too; saved_model.pb and fingerprint.pb may differ (README: the
    # traced functions' names carry a process-wide counter).
    exported = [{p.relative_to(tmp_path / name).as_posix(): p.read_bytes() for p in
                 (tmp_path / name / "saved_model" / "variables").iterdir()}
                for name in ("whole", "parts")]
    assert exported[0] == exported[1] and exported[0]


def test_item_chunk_trains_the_same_model(synthetic_split, tmp_path: Path) -> None:
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    for chunk in ("0", "64"):
        assert train(split, tmp_path / chunk, "--epochs", "2", "--item-chunk", chunk) == 0
    whole, chunked = read_log(tmp_path / "0"), read_log(tmp_path / "64")
    np.testing.assert_allclose([r["loss"] for r in chunked], [r["loss"] for r in whole],
                               rtol=1e-4)  # float32 sums in another order, over 12 steps
    assert json.loads((tmp_path / "64" / "train_manifest.json").read_text())[
        "parameters"]["item_chunk"] == 64


TIMING_FIELDS = {"epoch_seconds", "users_per_second", "input_seconds", "input_share",
                 "peak_rss_bytes"}


@pytest.mark.slow  # two vaecf train processes
def test_rerun_differs_only_in_the_timing_fields_the_docs_name(synthetic_split,
                                                              tmp_path: Path) -> None:
    """Two runs as a user reruns the stage: separate processes (within one process,
    TensorFlow numbers the traced functions anew and the SavedModel's bytes differ)."""
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    for name in ("a", "b"):
        subprocess.run([sys.executable, "-m", "vaecf.cli", "train", "--split", str(split),
                        "--output", str(tmp_path / name), *SMALL, "--epochs", "2"],
                       check=True, capture_output=True, timeout=300)
    logs = [read_log(tmp_path / name) for name in ("a", "b")]
    for ours, theirs in zip(*logs, strict=True):
        assert set(ours) == set(theirs)
        assert {k for k in ours if ours[k] != theirs[k]} <= TIMING_FIELDS
    files = [json.loads((tmp_path / name / "train_manifest.json").read_text())["files"]
             for name in ("a", "b")]
    assert {k for k in files[0] if files[0][k] != files[1][k]} <= {"train_log.jsonl"}
    assert any(k.startswith("saved_model/") for k in files[0])
    page = (Path(__file__).parents[2] / "docs" / "concepts" / "stages.md").read_text()
    assert all(f"`{field}`" in page for field in TIMING_FIELDS)  # the page says which differ


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(
        synthetic_split, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """NaN injection: a learning rate of 1e38 makes Adam's first update push the weights to
    ~1e38, so the next forward pass overflows (the divergence a bad learning rate causes in
    real runs). Epoch 1 runs normally; the resumed run diverges in epoch 2."""
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    assert train(split, tmp_path / "model", "--epochs", "1") == 0
    capsys.readouterr()
    code = train(split, tmp_path / "diverged", "--epochs", "3", "--learning-rate", "1e38",
                 "--checkpoint-dir", str(tmp_path / "model-checkpoints"))
    err = capsys.readouterr().err
    assert code == 1
    # the first step of epoch 2 applies the bad update, the second overflows; the resumed
    # run's first call is one step (then its replicas are broadcast), its next calls 1, 2, ...
    # steps, each read after the next is queued
    steps_per_epoch = -(-load_split(split).train.shape[0] // 100)
    assert err.strip() == (f"vaecf train: error: non-finite loss at epoch 2 step "
                           f"{steps_per_epoch + 2} (seen at step {steps_per_epoch + 2}: "
                           "results are read once per call, this one of 1 step)")
    assert not (tmp_path / "diverged").exists()
    assert sorted(p.name for p in (tmp_path / "model-checkpoints").iterdir()) == [
        "epoch-000001"]


def test_mixed_float16_records_the_loss_scale(synthetic_split, tmp_path: Path) -> None:
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    assert train(split, tmp_path / "model", "--epochs", "1", "--precision",
                 "mixed_float16") == 0
    record = read_log(tmp_path / "model")[0]
    assert record["precision"] == "mixed_float16"
    assert record["loss_scale"] == 32768.0 / 2 ** record["skipped_steps"]
    meta = json.loads((tmp_path / "model-checkpoints" / "epoch-000001" / "meta.json")
                      .read_text())
    assert meta["loss_scale"] == record["loss_scale"]


def test_wrong_expected_world_size_fails_before_writing(synthetic_split, tmp_path: Path,
                                                        cli) -> None:
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    code, _, err = cli("train", "--split", split, "--output", tmp_path / "model",
                       "--expect-world-size", "2")
    assert code == 1
    assert err.strip() == ("vaecf train: error: --expect-world-size 2: this job has 1 "
                           "process(es) (launch with horovodrun -np 2 or fix the flag)")
    assert not (tmp_path / "model").exists() and not (tmp_path / "model-checkpoints").exists()


def test_checkpoint_dir_that_cannot_be_created_fails_before_training(
        synthetic_split, tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "file").write_text("not a directory")
    code, out, err = cli("train", "--split", synthetic_split(n_users=600, n_items=300, seed=0),
                         "--output", tmp_path / "model", "--checkpoint-dir",
                         tmp_path / "file" / "ckpt", *SMALL)
    assert code == 1 and "training on" not in out  # refused before training started
    assert err == (f"vaecf train: error: --checkpoint-dir {tmp_path / 'file' / 'ckpt'}: "
                   f"{tmp_path / 'file'} is not a folder; nothing was written\n")
    assert not (tmp_path / "model").exists()


def test_batch_larger_than_the_training_users_is_refused(synthetic_split, tmp_path: Path,
                                                        cli) -> None:  # type: ignore[no-untyped-def]
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    users = load_split(split).train.shape[0]
    code, _, err = cli("train", "--split", split, "--output", tmp_path / "model",
                       *SMALL, "--batch-size", "1000000")
    assert code == 1
    assert err == (f"vaecf train: error: --batch-size 1000000: larger than the {users:,} "
                   f"training users of {split} (use at most {users})\n")
    assert not (tmp_path / "model").exists() and not (tmp_path / "model-checkpoints").exists()


def test_the_default_batch_fits_a_small_split_and_says_so(synthetic_split, tmp_path: Path,
                                                          cli) -> None:  # type: ignore[no-untyped-def]
    split = synthetic_split(n_users=300, n_items=100, seed=0)
    users = load_split(split).train.shape[0]
    assert users < 500
    small = ["--hidden", "16", "--latent", "8", "--epochs", "1"]
    code, out, err = cli("train", "--split", split, "--output", tmp_path / "model", *small)
    assert code == 0, err
    assert (f"batch {users}: the default --batch-size 500 is larger than the {users:,} "
            f"training users of {split}") in out
    manifest = json.loads((tmp_path / "model" / "train_manifest.json").read_text())
    assert manifest["parameters"]["batch_size"] == users
    assert manifest["parameters"]["batch_size_default"] is True
    code, _, err = cli("train", "--split", split, "--output", tmp_path / "chosen", *small,
                       "--batch-size", "500")  # chosen by the user: still an error
    assert code == 1 and f"--batch-size 500: larger than the {users:,} training users" in err


def resplit(split: Path, output: Path, seed: int) -> Path:
    """The same interactions as ``split``, split again with another seed."""
    import pandas as pd

    from vaecf.data.split import SplitConfig, split_interactions, write_split

    users = pd.read_parquet(split / "user_index.parquet").set_index("user_idx")["user_id"]
    items = pd.read_parquet(split / "item_index.parquet").set_index("item_idx")["item_id"]
    pairs = pd.concat([pd.read_parquet(split / f"{name}.parquet")
                       for name in ("train", "val_fold_in", "val_holdout", "test_fold_in",
                                    "test_holdout")])
    frame = pd.DataFrame({"user_id": users.loc[pairs["user_idx"]].to_numpy(),
                          "item_id": items.loc[pairs["item_idx"]].to_numpy()})
    output.mkdir()
    write_split(split_interactions(frame, SplitConfig(seed=seed)), output, inputs={},
                parameters={}, started=0.0)
    return output


def test_checkpoint_of_another_split_is_not_resumed(synthetic_split, tmp_path: Path,
                                                    cli) -> None:  # type: ignore[no-untyped-def]
    ours = synthetic_split(n_users=600, n_items=300, seed=0)
    other = resplit(ours, tmp_path / "other", seed=7)
    assert load_split(other).n_items == load_split(ours).n_items  # only the digest tells
    checkpoints = tmp_path / "ours-checkpoints"
    assert train(ours, tmp_path / "ours", "--epochs", "1") == 0
    code, _, err = cli("train", "--split", other, "--output", tmp_path / "model", *SMALL,
                       "--epochs", "2", "--checkpoint-dir", checkpoints)
    assert code == 1
    assert err == (f"vaecf train: error: {checkpoints}/epoch-000001: written for another split "
                   f"(split digest {load_split(ours).digest[:12]}, this split's "
                   f"{load_split(other).digest[:12]}; use another --checkpoint-dir to start "
                   "afresh)\n")
    assert not (tmp_path / "model").exists()
    assert [p.name for p in checkpoints.iterdir()] == ["epoch-000001"]


def test_split_and_outputs_on_s3(synthetic_split, s3_bucket: str) -> None:
    from vaecf.io import storage

    split = synthetic_split(n_users=600, n_items=300, seed=0)
    storage.upload_dir(split, f"s3://{s3_bucket}/split")
    assert main(["train", "--split", f"s3://{s3_bucket}/split", "--output",
                 f"s3://{s3_bucket}/model", "--epochs", "1", *SMALL]) == 0
    keys = storage.list_keys(f"s3://{s3_bucket}/model")
    assert {"_SUCCESS", "train_log.jsonl", "train_manifest.json",
            "saved_model/saved_model.pb"} <= set(keys)
    assert storage.list_keys(f"s3://{s3_bucket}/model-checkpoints") == [
        "epoch-000001/meta.json", "epoch-000001/state.npz"]


BANNERS = ("oneDNN custom operations", "cpu_feature_guard", "This TensorFlow binary")


def run_cli(*argv: object) -> subprocess.Popen[str]:
    """The real ``vaecf`` CLI in a fresh process, stdout to a pipe (as in a container or KFP),
    without the TF_CPP_MIN_LOG_LEVEL that conftest and the Makefile set: the CLI sets its own."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["TF_DETERMINISTIC_OPS"] = "1"  # runs compared bit for bit
    return subprocess.Popen([sys.executable, "-m", "vaecf.cli", *map(str, argv)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=300)
    return process.returncode, out, err


def read_until(process: subprocess.Popen[str], prefix: str) -> None:
    """Read the process's stdout up to the first line starting with ``prefix`` (or its end)."""
    assert process.stdout is not None
    line = process.stdout.readline()
    while line and not line.startswith(prefix):
        line = process.stdout.readline()


# Four epochs of 150 steps, validated at the end only: long enough to be stopped mid-run.
STOPPABLE = ["--epochs", "4", "--steps-per-epoch", "150", "--batch-size", "100", "--hidden",
             "64", "--latent", "16", "--validate-every", "4"]


@pytest.mark.slow  # a vaecf train process
def test_log_in_a_pipe_has_one_line_per_epoch_and_no_banner(synthetic_split,
                                                            tmp_path: Path) -> None:
    """Issue 13: progress lines were printed twice and TensorFlow's banners leaked. Also the
    small-data defaults: one checkpoint (the last epoch; the 600 s interval never passed) and
    beta reaching --beta-cap at the run's last step."""
    split, model = synthetic_split(n_users=600, n_items=300, seed=0), tmp_path / "model"
    code, out, err = finish(run_cli("train", "--split", split, "--output", model,
                                    "--epochs", "3", "--batch-size", "100", "--hidden", "64",
                                    "--latent", "16"))
    assert code == 0, err[-3000:]
    assert not any(banner in out + err for banner in BANNERS), err[-3000:]
    lines = out.splitlines()
    for epoch in (1, 2, 3):  # the epoch's one line; its steps and validation bars are in it
        assert sum(line.startswith(f"epoch {epoch}: loss") for line in lines) == 1, out
    # A step line only where an epoch's work passed the pipe's 5 s interval (the first epoch,
    # tracing the deep encoder's step on a busy host), and no line twice.
    steps = [line for line in lines if "steps (" in line]
    assert all(line.startswith("epoch 1: ") for line in steps), out
    assert len(set(lines)) == len(lines), out
    assert not any("evaluating" in line for line in lines), out
    assert sorted(p.name for p in (tmp_path / "model-checkpoints").iterdir()) == [
        "epoch-000003"]
    steps = -(-load_split(split).train.shape[0] // 100)
    manifest = json.loads((model / "train_manifest.json").read_text())
    assert manifest["parameters"]["anneal_steps"] == int((3 * steps - 1) / 0.2)
    assert read_log(model)[-1]["beta"] == pytest.approx(0.2)

    code, out, err = finish(run_cli("evaluate", "--split", split, "--model", model,
                                    "--output", tmp_path / "metrics"))
    assert code == 0, err[-3000:]
    assert not any(banner in out + err for banner in BANNERS), err[-3000:]
    progress = [line for line in out.splitlines() if line.startswith("evaluating:")]
    assert len(progress) == 1 and "(100%" in progress[0], out


@pytest.mark.slow  # vaecf train processes, one stopped by SIGTERM
def test_sigterm_checkpoints_the_epoch_and_a_rerun_resumes_the_same_run(
        synthetic_split, tmp_path: Path) -> None:
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    flags = ["--split", split, *STOPPABLE]
    stopped = run_cli("train", "--output", tmp_path / "parts", *flags)
    read_until(stopped, "epoch 1:")
    stopped.send_signal(signal.SIGTERM)
    code, _, err = finish(stopped)
    assert code == 1 and "stopped by SIGTERM after epoch" in err, err[-3000:]
    epoch = int(err.split("after epoch ")[1].split()[0])
    assert epoch < 4 and not (tmp_path / "parts").exists()
    kept = sorted(p.name for p in (tmp_path / "parts-checkpoints").iterdir())
    assert kept[-1] == f"epoch-{epoch:06d}"  # the interval had not passed: SIGTERM wrote it

    code, out, err = finish(run_cli("train", "--output", tmp_path / "parts", *flags))
    assert code == 0 and f"resuming from checkpoint epoch-{epoch:06d}" in out, err[-3000:]
    code, _, err = finish(run_cli("train", "--output", tmp_path / "whole", *flags))
    assert code == 0, err[-3000:]
    whole, parts = read_log(tmp_path / "whole"), read_log(tmp_path / "parts")
    assert [r["loss"] for r in whole] == [r["loss"] for r in parts]
    assert [r["beta"] for r in whole] == [r["beta"] for r in parts]


@pytest.mark.parametrize("where", ["split", "split/checkpoints", "model", "model/saved_model"])
def test_checkpoint_dir_in_the_split_or_another_output_is_refused(trained, tmp_path: Path, cli,
                                                                  where: str) -> None:  # type: ignore[no-untyped-def]
    """Checkpoints in the split, or in another model's output, would put files there that
    its manifest does not list (the stages then refuse it as an input or output)."""
    split, model = trained
    folder = {"split": split, "model": model}[where.split("/")[0]]
    checkpoints = folder.joinpath(*where.split("/")[1:])
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    code, out, err = cli("train", "--split", split, "--output", tmp_path / "new", *SMALL,
                         "--checkpoint-dir", checkpoints)
    assert code == 1 and "training on" not in out
    if where.startswith("split"):
        assert err == (f"vaecf train: error: --checkpoint-dir {checkpoints}: is, holds or lies "
                       f"inside the input {split} (it goes in a folder of its own); nothing "
                       "was written\n")
    elif where == "model":
        assert err == (f"vaecf train: error: --checkpoint-dir {checkpoints}: holds "
                       "train_manifest.json, a stage's output (it goes in a folder of its "
                       "own); nothing was written\n")
    else:
        assert err == (f"vaecf train: error: --checkpoint-dir {checkpoints}: lies inside "
                       f"{model}, a stage's output (it holds train_manifest.json); nothing "
                       "was written\n")
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before
    assert not (tmp_path / "new").exists()


def test_s3_checkpoint_dir_in_the_split_or_another_output_is_refused(synthetic_split, cli,
                                                                     s3_bucket: str) -> None:  # type: ignore[no-untyped-def]
    from vaecf.io import storage

    split = f"s3://{s3_bucket}/split"
    storage.upload_dir(synthetic_split(n_users=600, n_items=300, seed=0), split)
    before = storage.list_keys(split)
    why = f"is, holds or lies inside the input {split}"
    for checkpoints in (f"{split}/checkpoints", split, f"s3://{s3_bucket}/split/"):
        code, _, err = cli("train", "--split", split, "--output", f"s3://{s3_bucket}/model",
                           *SMALL, "--checkpoint-dir", checkpoints)
        assert (code, err) == (1, f"vaecf train: error: --checkpoint-dir {checkpoints}: {why} "
                                  "(it goes in a folder of its own); nothing was written\n")
    code, _, err = cli("train", "--split", f"s3://{s3_bucket}/split/", "--output",
                       f"s3://{s3_bucket}/model", *SMALL, "--checkpoint-dir",
                       f"s3://{s3_bucket}/split")
    assert code == 1 and "lies inside the input" in err
    storage.upload_dir(synthetic_split(n_users=600, n_items=300, seed=0),
                       f"s3://{s3_bucket}/other")
    code, _, err = cli("train", "--split", split, "--output", f"s3://{s3_bucket}/model",
                       *SMALL, "--checkpoint-dir", f"s3://{s3_bucket}/other")
    assert err == (f"vaecf train: error: --checkpoint-dir s3://{s3_bucket}/other: holds "
                   "dataset_manifest.json, a stage's output (it goes in a folder of its own); "
                   "nothing was written\n")
    assert storage.list_keys(split) == before
    assert storage.list_keys(f"s3://{s3_bucket}/model") == []


def test_checkpoint_dir_where_nothing_can_be_created_fails_before_training(
        synthetic_split, tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    """``/proc`` refuses new folders even to root, whom ``os.access`` tells it is writable:
    it is refused up front (as root it trained for an epoch, then failed at the first
    checkpoint)."""
    code, out, err = cli("train", "--split", synthetic_split(n_users=600, n_items=300, seed=0),
                         "--output", tmp_path / "model", "--checkpoint-dir", "/proc/ckpt",
                         *SMALL)
    assert code == 1 and "training on" not in out
    assert err.startswith("vaecf train: error: --checkpoint-dir '/proc/ckpt': lies in /proc, a "
                          "special file system") and err.count("\n") == 1, err
    assert not (tmp_path / "model").exists()


@pytest.fixture()
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A 256 KiB tmpfs: room for one checkpoint of a 16-unit model, not two."""
    yield from tmpfs(tmp_path, "256k")


def test_full_disk_at_a_checkpoint_is_one_line_and_keeps_the_last_good_one(
        synthetic_split, tmp_path: Path, cli, small_disk: Path) -> None:  # type: ignore[no-untyped-def]
    from vaecf.train import checkpoint

    split = synthetic_split(n_users=600, n_items=300, seed=0)
    code, out, err = cli("train", "--split", split, "--output", tmp_path / "model",
                         "--batch-size", "100", "--hidden", "16", "--latent", "8",
                         "--epochs", "2", "--checkpoint-every", "1",
                         "--checkpoint-dir", small_disk)
    assert code == 1 and f"checkpoint {small_disk}/epoch-000001 written" in out
    assert err == (f"vaecf train: error: checkpoint {small_disk}/epoch-000002: cannot write it "
                   "(No space left on device); the previous checkpoints are kept\n")
    assert [p.name for p in small_disk.iterdir()] == ["epoch-000001"]  # no .epoch-* debris
    found = checkpoint.load_newest(str(small_disk))
    assert found is not None and found.name == "epoch-000001"
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize("flag", ["--hidden", "--latent"])
def test_model_too_large_is_refused_before_allocating(synthetic_split, tmp_path: Path, cli,
                                                      flag: str) -> None:  # type: ignore[no-untyped-def]
    """It ended in TensorFlow's ResourceExhaustedError when the weights were created."""
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    code, _, err = cli("train", "--split", split, "--output", tmp_path / "model", *SMALL,
                       flag, "1000000000")
    hidden, latent = ("1000000000", "16") if flag == "--hidden" else ("64", "1000000000")
    assert code == 1
    assert err.startswith(f"vaecf train: error: --hidden {hidden} --latent {latent} with "
                          "300 items: ") and err.count("\n") == 1, err
    assert "more than the 2,147,483,647 this trainer supports" in err
    assert not (tmp_path / "model").exists()
    assert not (tmp_path / "model-checkpoints").exists()


@pytest.mark.slow  # a vaecf train process stopped by SIGINT
def test_ctrl_c_stops_like_sigterm_without_a_traceback(synthetic_split, tmp_path: Path) -> None:
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    process = run_cli("train", "--split", split, "--output", tmp_path / "model", *STOPPABLE)
    read_until(process, "epoch 1:")
    process.send_signal(signal.SIGINT)
    code, _, err = finish(process)
    assert code == 1, err[-3000:]
    assert err.startswith("vaecf train: error: stopped by SIGINT after epoch "), err[-3000:]
    assert err.count("\n") == 1 and "Traceback" not in err
    epoch = int(err.split("after epoch ")[1].split()[0])
    assert epoch < 4 and not (tmp_path / "model").exists()
    kept = sorted(p.name for p in (tmp_path / "model-checkpoints").iterdir())
    assert kept[-1] == f"epoch-{epoch:06d}"


def test_ctrl_c_before_the_first_epoch_is_one_line_too(synthetic_split, tmp_path: Path) -> None:
    """Ctrl-C while the model is built: KeyboardInterrupt, reported in one line, exit 1 (or,
    if the loop had started, the run stops after its epoch as above)."""
    split = synthetic_split(n_users=600, n_items=300, seed=0)
    process = run_cli("train", "--split", split, "--output", tmp_path / "model", *SMALL,
                      "--epochs", "2")
    read_until(process, "training on")
    process.send_signal(signal.SIGINT)
    code, _, err = finish(process)
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err[-3000:]
    interrupted = (f"vaecf train: error: stopped by SIGINT; checkpoints in {tmp_path}/"
                   "model-checkpoints are kept (rerun to resume from the newest)\n")
    assert err == interrupted or err.startswith("vaecf train: error: stopped by SIGINT after "
                                                "epoch 1 "), err
    assert not (tmp_path / "model").exists()


@pytest.mark.slow  # vaecf train processes, one killed
def test_tensorflow_temp_files_of_a_killed_run_are_swept(synthetic_split,
                                                         tmp_path: Path) -> None:
    """autograph writes ``__autograph_generated_file*.py`` into $TMPDIR and removes them only
    at a clean exit: a killed run's go with its private folder, swept by the next stage."""
    split, tmp = synthetic_split(n_users=600, n_items=300, seed=0), tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    argv = [sys.executable, "-m", "vaecf.cli", "train", "--split", str(split), *SMALL]
    killed = subprocess.Popen([*argv, "--output", str(tmp_path / "killed"), "--epochs", "3"],
                              env=env, stdout=subprocess.PIPE, text=True)
    read_until(killed, "epoch 1:")
    killed.kill()
    killed.communicate(timeout=60)
    generated = list(tmp.rglob("__autograph_generated_file*.py"))
    assert generated and {p.parent.parent for p in generated} == {tmp}
    (private,) = {p.parent for p in generated}
    assert private.name.startswith(f"vaecf-tf-{killed.pid}-")
    done = subprocess.run([*argv, "--output", str(tmp_path / "model"), "--epochs", "1"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert list(tmp.iterdir()) == []  # the dead run's folder swept, the new one removed


@pytest.mark.parametrize("value", ["-1", "1025"])
def test_steps_per_call_out_of_its_range_is_refused(synthetic_split, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    value: str) -> None:
    code = train(synthetic_split(), tmp_path / "model", "--steps-per-call", value)
    err = capsys.readouterr().err
    expected = ("argument --steps-per-call: expected an integer >= 0, got -1" if value == "-1"
                else "--steps-per-call 1025: expected 0..1024 (the upper bound: the rows of a "
                     "call's statistics buffer)")
    assert code != 0 and len(err.strip().splitlines()) == 1 and expected in err
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize("flag", ["--patience", "--max-epochs"])
def test_early_stopping_flags_with_a_fixed_epoch_count_are_refused(synthetic_split,
                                                                   tmp_path: Path, cli,
                                                                   flag: str) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli("train", "--split", synthetic_split(), "--output", tmp_path / "model",
                         *SMALL, "--epochs", "3", flag, "5")
    assert (code, err) == (1, f"vaecf train: error: {flag} 5: applies only without --epochs "
                              "(--epochs 3 trains exactly that many epochs)\n")
    assert "training on" not in out and not list(tmp_path.iterdir())
