"""The cases a hostile campaign found on the newer surfaces: TensorBoard folders, search
spaces, checkpoints, S3 leases, recommend inputs, Kubernetes templates and names, debris."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import boto3
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from stage_checks import tmpfs

SMALL = ("--epochs", "1", "--batch-size", "100", "--hidden", "16", "--latent", "8")


def one_line(result: tuple[int, str, str], stage: str, *expected: str) -> str:
    code, _, err = result
    assert code == 1, err[-2000:]
    assert len(err.strip().splitlines()) == 1, err[-2000:]
    assert err.startswith(f"vaecf {stage}: error: "), err
    for text in expected:
        assert text in err, err
    return err


def tree(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes()
            for p in sorted(path.rglob("*")) if p.is_file()}


def bucket_keys(bucket: str) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []))


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vaecf.cli import main

    out = tmp_path_factory.mktemp("raw") / "raw"
    assert main(["download", "--dataset", "synthetic", "--synthetic-users", "100",
                 "--synthetic-items", "50", "--output", str(out)]) == 0
    return out


# ---- train --tensorboard-dir is an output: checked like one, before any work

@pytest.mark.parametrize("where", ["other-output", "split", "inside-split", "model",
                                   "inside-model", "symlink-into-split", "existing-file",
                                   "proc"])
def test_tensorboard_dir_only_where_train_owns_it(cli, synthetic_split, raw: Path,
                                                  tmp_path: Path, where: str) -> None:
    split = synthetic_split()
    before = tree(split), tree(raw)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "link").symlink_to(split)
    model = tmp_path / "model"
    value = {"other-output": raw, "split": split, "inside-split": split / "tb",
             "model": model, "inside-model": model / "tb",
             "symlink-into-split": tmp_path / "link" / "tb",
             "existing-file": tmp_path / "notes.txt", "proc": "/proc/self/tb"}[where]
    result = cli("train", "--split", split, "--output", model, "--tensorboard-dir", value,
                 *SMALL)
    one_line(result, "train", "--tensorboard-dir")
    assert "training on" not in result[1]
    assert (tree(split), tree(raw)) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "notes.txt"]


def test_tensorboard_dir_on_s3_never_climbs_or_enters_another_output(
        cli, synthetic_split, raw: Path, s3_bucket: str, tmp_path: Path) -> None:
    assert cli("download", "--dataset", "synthetic", "--synthetic-users", "100",
               "--synthetic-items", "50", "--output", f"s3://{s3_bucket}/run1/raw")[0] == 0
    before = bucket_keys(s3_bucket)
    for value in (f"s3://{s3_bucket}/runs/../run1/raw", f"s3://{s3_bucket}/runs//tb",
                  f"s3://{s3_bucket}/run1/raw", f"s3://{s3_bucket}/run1/raw/tb"):
        result = cli("train", "--split", synthetic_split(), "--output", tmp_path / "model",
                     "--tensorboard-dir", value, *SMALL)
        one_line(result, "train", "--tensorboard-dir")
    assert bucket_keys(s3_bucket) == before
    assert not (tmp_path / "model").exists()


def test_tensorboard_dir_of_an_earlier_run_is_reused(cli, synthetic_split,
                                                     tmp_path: Path) -> None:
    board = tmp_path / "board"
    for run in ("a", "b"):
        code, _, err = cli("train", "--split", synthetic_split(), "--output",
                           tmp_path / run, "--tensorboard-dir", board, *SMALL)
        assert code == 0, err
    events = sorted(p.name for p in board.iterdir())
    assert len(events) == 2 and all(e.startswith("events.out.tfevents.") for e in events)
    (board / "mine.txt").write_text("not TensorBoard's")
    one_line(cli("train", "--split", synthetic_split(), "--output", tmp_path / "c",
                 "--tensorboard-dir", board, *SMALL), "train", "mine.txt")


# ---- vaecf tune --space: bounded before anything is expanded or read whole

def run_limited(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``vaecf <argv>`` in a process limited to 3 GiB of address space and 120 s."""
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))"
    code = f"{limit}; import sys; from vaecf.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


@pytest.mark.parametrize("case", ["grid", "dev-zero", "not-utf8", "huge-epochs"])
def test_tune_space_is_bounded(synthetic_split, tmp_path: Path, case: str) -> None:
    grid = {"beta_cap": list(range(1000)), "learning_rate": [1e-5 * (i + 1) for i in
                                                             range(1000)],
            "dropout": [i / 1001 for i in range(1000)], "hidden": list(range(1, 1001))}
    (tmp_path / "grid.json").write_text(json.dumps(grid))  # 10^12 points
    (tmp_path / "latin1.json").write_bytes('{"dropout": [0.5], "h\xe9": [1]}'.encode("latin-1"))
    space = {"grid": "@" + str(tmp_path / "grid.json"), "dev-zero": "@/dev/zero",
             "not-utf8": "@" + str(tmp_path / "latin1.json"),
             "huge-epochs": '{"epochs": [1e300]}'}[case]
    done = run_limited("tune", "--split", str(synthetic_split()), "--output",
                       str(tmp_path / "out"), "--space", space, "--trials", "1",
                       cwd=tmp_path)
    one_line((done.returncode, done.stdout, done.stderr), "tune", "--space")
    assert not (tmp_path / "out").exists()


def test_tune_output_inside_one_of_its_trials_is_refused(cli, synthetic_split,
                                                         tmp_path: Path) -> None:
    previous = tmp_path / "tuned"
    trial = previous / "trials" / "trial-000"
    trial.mkdir(parents=True)
    (trial / "train_manifest.json").write_text(json.dumps({"stage": "train", "files": {}}))
    (previous / "tune_manifest.json").write_text(json.dumps(
        {"stage": "tune", "files": {"trials/trial-000/train_manifest.json": {}}}))
    before = tree(previous)
    one_line(cli("tune", "--split", synthetic_split(), "--output", trial / "again",
                 "--space", '{"epochs": [1]}', "--trials", "1", "--baselines"),
             "tune", "lies inside", str(trial))
    assert tree(previous) == before and not (trial / "again").exists()


# ---- checkpoints: vaecf's own files are recognised, an edited meta.json is one line

def _two_checkpoints(directory: Path) -> None:
    from vaecf.train import checkpoint

    meta = {"step": 3, "log": [], "best_epoch": None, "best_ndcg": -1.0, "n_items": 3,
            "split_digest": "d", "world_size": 1, "parameters": {}}
    for epoch in (1, 2):
        checkpoint.save(str(directory), epoch, meta, {"model/0": np.full(3, epoch, "f4")})


@pytest.mark.parametrize("edit", ["list", "text-epoch", "huge-epoch-text"])
def test_an_edited_checkpoint_meta_is_skipped_not_a_traceback(tmp_path: Path,
                                                              edit: str) -> None:
    from vaecf.train import checkpoint

    _two_checkpoints(tmp_path)
    meta_path = tmp_path / "epoch-000002" / "meta.json"
    meta = json.loads(meta_path.read_text())
    if edit == "list":
        meta_path.write_text(json.dumps([meta]))
    else:
        meta["epoch"] = "two" if edit == "text-epoch" else "9" * 5000
        meta_path.write_text(json.dumps(meta))
    found = checkpoint.load_newest(str(tmp_path))
    assert found is not None and found.name == "epoch-000001"
    assert found.meta["epoch"] == 1


def test_training_never_deletes_a_users_folders_named_like_checkpoints(tmp_path: Path) -> None:
    from vaecf.train import checkpoint

    for name in ("epoch-000001", "epoch-000002"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "notes.txt").write_text(f"my {name}")
    (tmp_path / "epoch-000003").mkdir()  # empty: no meta.json, not a checkpoint either
    meta = {"step": 3, "log": [], "best_epoch": None, "best_ndcg": -1.0, "n_items": 3,
            "split_digest": "d", "world_size": 1, "parameters": {}}
    for epoch in (4, 5, 6, 7):
        checkpoint.save(str(tmp_path), epoch, meta, {"model/0": np.zeros(3, "f4")})
    assert checkpoint.list_checkpoints(str(tmp_path)) == [
        "epoch-000007", "epoch-000006", "epoch-000005"]
    for name in ("epoch-000001", "epoch-000002"):
        assert (tmp_path / name / "notes.txt").read_text() == f"my {name}"
    assert (tmp_path / "epoch-000003").is_dir()


def test_train_refuses_a_checkpoint_dir_holding_a_users_files(cli, synthetic_split,
                                                              tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    (ckpt / "epoch-000001").mkdir(parents=True)
    (ckpt / "epoch-000001" / "notes.txt").write_text("mine")
    one_line(cli("train", "--split", synthetic_split(), "--output", tmp_path / "model",
                 "--checkpoint-dir", ckpt, *SMALL), "train", "--checkpoint-dir",
             "epoch-000001/notes.txt")
    assert tree(ckpt) == {"epoch-000001/notes.txt": b"mine"}


@pytest.fixture()
def tiny_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A 16 KiB tmpfs: too small for any checkpoint."""
    yield from tmpfs(tmp_path, "16k")


def test_a_full_disk_at_the_first_checkpoint_leaves_no_folder(cli, synthetic_split,
                                                             tmp_path: Path,
                                                             tiny_disk: Path) -> None:
    one_line(cli("train", "--split", synthetic_split(), "--output", tmp_path / "model",
                 "--checkpoint-dir", tiny_disk / "runs" / "ckpt", *SMALL), "train",
             "No space left on device")
    assert list(tiny_disk.iterdir()) == []
    assert not (tmp_path / "model").exists()


# ---- S3: the lease object as someone may have left it; a killed run's $TMPDIR

@pytest.mark.parametrize("held", ['{"time": "yesterday", "pid": "x", "host": 7}',
                                  '{"time": 1e300, "pid": 99999999999999999999}',
                                  '[1, 2]', "\xff not even text"])
def test_a_strange_lease_object_is_one_line(cli, raw: Path, s3_bucket: str,
                                            held: str) -> None:
    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    s3.put_object(Bucket=s3_bucket, Key="runs/.out.lock", Body=held.encode("latin-1"))
    one_line(cli("preprocess", "--input", raw, "--output", f"s3://{s3_bucket}/runs/out"),
             "preprocess", "another vaecf stage is writing this output now")
    assert bucket_keys(s3_bucket) == ["runs/.out.lock"]


KILL_AT_MANIFEST = """
import os, signal, sys, boto3
boto3.setup_default_session()
def kill(params, **_):
    if params.get("Key", "").endswith("dataset_manifest.json"):
        os.kill(os.getpid(), signal.SIGKILL)
boto3.DEFAULT_SESSION.events.register("before-parameter-build.s3.GetObject", kill)
boto3.DEFAULT_SESSION.events.register("before-parameter-build.s3.HeadObject", kill)
from vaecf.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_split_killed_while_reading_its_previous_s3_manifest_leaves_no_tmp(
        cli, raw: Path, s3_bucket: str, tmp_path: Path) -> None:
    inter = tmp_path / "inter"
    assert cli("preprocess", "--input", raw, "--output", inter)[0] == 0
    output = f"s3://{s3_bucket}/split"
    assert cli("split", "--input", inter, "--output", output)[0] == 0
    (temp := tmp_path / "tmp").mkdir()
    killed = subprocess.run([sys.executable, "-c", KILL_AT_MANIFEST, "split", "--input",
                             str(inter), "--output", output], capture_output=True, text=True,
                            env={**os.environ, "TMPDIR": str(temp)}, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert sorted(p.name for p in temp.iterdir()) == []


# ---- outputs below a symbolic link

def test_an_output_below_a_link_to_nothing_is_one_line(cli, raw: Path, tmp_path: Path) -> None:
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    one_line(cli("preprocess", "--input", raw, "--output", tmp_path / "gone" / "out"),
             "preprocess", "symbolic link to nothing")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gone"]


def test_an_output_through_a_link_is_written_where_it_was_checked(cli, raw: Path,
                                                                  tmp_path: Path) -> None:
    """``l/../o`` is ``o`` beside where ``l`` points, as the kernel reads it; the check and
    the publish read it the same way (the check once read one place, the publish another)."""
    (tmp_path / "there" / "deep").mkdir(parents=True)
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "l").symlink_to(tmp_path / "there" / "deep")
    assert cli("preprocess", "--input", raw, "--output", tmp_path / "here" / "l" / ".." /
               "out")[0] == 0
    assert (tmp_path / "there" / "out" / "preprocess_manifest.json").is_file()
    assert sorted(p.name for p in (tmp_path / "here").iterdir()) == ["l"]


def test_demo_refuses_the_working_directory(cli, raw: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(raw, tmp_path / "raw")
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    for output in (".", "./", str(tmp_path)):
        one_line(cli("demo", "--output", output, "--workers", "1", "--epochs", "1",
                     "--users", "50", "--items", "20"), "demo", "--output")
    assert tree(tmp_path) == before


# ---- Kubernetes templates and names

@pytest.mark.parametrize("template", ["latin1", "no-spec", "string-container"])
@pytest.mark.parametrize("stage", ["launch-mpijob", "deploy", "launch-sparkapp"])
def test_a_broken_template_is_one_line(cli, tmp_path: Path, stage: str,
                                       template: str) -> None:
    from vaecf.k8s import inferenceservice, render, sparkapp

    source = {"launch-mpijob": render.default_template(),
              "deploy": inferenceservice.default_template(),
              "launch-sparkapp": sparkapp.default_template()}[stage].read_text()
    path = tmp_path / "template.yaml"
    if template == "latin1":
        path.write_bytes(source.replace("metadata:", "# caf\xe9\nmetadata:", 1)
                         .encode("latin-1"))
    elif template == "no-spec":
        path.write_text(source.split("\nspec:")[0] + "\n")
    else:
        import yaml

        doc = yaml.safe_load(source)
        if stage == "deploy":
            doc["spec"]["predictor"]["containers"] = ["vaecf"]
        elif stage == "launch-sparkapp":
            doc["spec"]["driver"]["template"]["spec"]["containers"] = ["vaecf"]
        else:
            doc["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"] = \
                ["vaecf"]
        path.write_text(yaml.safe_dump(doc))
    (tmp_path / "split").mkdir()
    common = ["--store", "s3://bucket/store", "--run-id", "r1", "--image",
              "registry.example/vaecf:1", "--namespace", "ml", "--template", str(path)]
    argv = {"launch-mpijob": ["--split", str(tmp_path / "split"),
                              "--output", str(tmp_path / "out")],
            "deploy": ["--model", str(tmp_path / "split")],
            "launch-sparkapp": ["--stage", "split", "--input", str(tmp_path / "split"),
                                "--output", str(tmp_path / "out")]}[stage]
    one_line(cli(stage, *argv, *common), stage, str(path))


@pytest.mark.parametrize("flag,value", [("--namespace", "a.b"), ("--namespace", "a" * 64),
                                        ("--secret-name", "s" * 300),
                                        ("--service-account", "s" * 300)])
def test_kubernetes_names_are_checked(cli, tmp_path: Path, flag: str, value: str) -> None:
    (tmp_path / "split").mkdir()
    common = ["--store", "s3://bucket/store", "--run-id", "r1", "--image",
              "registry.example/vaecf:1", flag, value]
    if flag != "--namespace":
        common += ["--namespace", "ml"]
    stage = "deploy" if flag == "--service-account" else "launch-mpijob"
    argv = (["--split", str(tmp_path / "split"), "--output", str(tmp_path / "out")]
            if stage == "launch-mpijob" else ["--model", str(tmp_path / "split")])
    one_line(cli(stage, *argv, *common), stage, flag)


# ---- recommend: what a user file may hold

def test_recommend_refuses_a_list_column(cli, small_model: Path, tmp_path: Path) -> None:
    path = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({"user_id": pa.array([[1, 2], [3]]),
                             "item_id": pa.array([1, 2])}), path)
    one_line(cli("recommend", "--model", small_model, "--input", path, "--output",
                 tmp_path / "out"), "recommend", str(path), "user_id")
    assert not (tmp_path / "out").exists()


def _recommended(cli, model: Path, pairs: Path, out: Path) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
    code, _, err = cli("recommend", "--model", model, "--input", pairs, "--output", out,
                       "--top-k", "5")
    assert code == 0, err
    table = pq.read_table(out / "recommendations.parquet").to_pylist()
    found: dict[str, list[str]] = {}
    for row in table:
        found.setdefault(str(row["user_id"]), []).append(str(row["item_id"]))
    return found


def test_recommend_counts_a_repeated_pair_once(cli, small_model: Path, tmp_path: Path) -> None:
    items = pq.read_table(small_model / "item_index.parquet").column("item_id").to_pylist()
    once = "user_id,item_id\n" + "".join(f"u{u},{i}\n" for u in range(3)
                                         for i in items[u:u + 4])
    twice = once + "".join(f"u{u},{items[u]}\n" for u in range(3))
    (tmp_path / "once.csv").write_text(once)
    (tmp_path / "twice.csv").write_text(twice)
    assert (_recommended(cli, small_model, tmp_path / "once.csv", tmp_path / "a")
            == _recommended(cli, small_model, tmp_path / "twice.csv", tmp_path / "b"))


def test_recommend_keeps_a_user_id_with_a_nul_apart(cli, small_model: Path,
                                                   tmp_path: Path) -> None:
    items = pq.read_table(small_model / "item_index.parquet").column("item_id").to_pylist()
    (tmp_path / "pairs.csv").write_text(
        "user_id,item_id\n" + "".join(f"a,{i}\n" for i in items[:3])
        + "".join(f"a\0b,{i}\n" for i in items[10:13]))
    found = _recommended(cli, small_model, tmp_path / "pairs.csv", tmp_path / "out")
    assert sorted(found) == ["a", "a\0b"]


# ---- evaluate: what the model was trained on, not what its manifest says

def test_evaluate_refuses_a_model_whose_split_digest_was_edited(
        cli, small_model: Path, synthetic_split, tmp_path: Path) -> None:
    from vaecf.data.splits import split_digest

    other = synthetic_split(n_users=600, n_items=300, seed=2)  # 300 items too, other users
    model = tmp_path / "model"
    shutil.copytree(small_model, model)
    manifest = json.loads((model / "train_manifest.json").read_text())
    assert manifest["n_items"] == json.loads((other / "dataset_manifest.json").read_text())[
        "n_items"]
    manifest["split_digest"] = split_digest(json.loads(
        (other / "dataset_manifest.json").read_text()))
    (model / "train_manifest.json").write_text(json.dumps(manifest))
    one_line(cli("evaluate", "--split", other, "--model", model, "--output", tmp_path / "m"),
             "evaluate", "trained on another split")
    assert not (tmp_path / "m").exists()


# ---- train: the model's size is checked before anything is written

def test_a_model_too_large_for_memory_leaves_nothing(cli, synthetic_split, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """RecVAE's encoder blocks count: 20 layers of 1,024 hold ~21M parameters (~330 MB with
    Adam), refused on a machine pinned to 200 MB before the output is locked or staged."""
    from vaecf.train import memory

    monkeypatch.setattr(memory, "available_bytes", lambda: 200 * 2**20)
    one_line(cli("train", "--split", synthetic_split(), "--output", tmp_path / "model",
                 "--epochs", "1", "--batch-size", "100", "--hidden", "1024", "--latent", "8",
                 "--encoder-layers", "20"),
             "train", "--hidden 1024 --latent 8 with 300 items: training needs at least",
             "parameters in 20 encoder layers")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no lock, staging, checkpoints


# ---- split: an edited manifest is one line, whatever number it holds

@pytest.mark.parametrize("rows", [2**64, 2**63, -1])
def test_an_edited_row_group_count_is_one_line(cli, synthetic_split, tmp_path: Path,
                                               rows: int) -> None:
    split = tmp_path / "split"
    shutil.copytree(synthetic_split(), split)
    manifest = json.loads((split / "dataset_manifest.json").read_text())
    manifest["train_row_groups"][0][1] = rows
    (split / "dataset_manifest.json").write_text(json.dumps(manifest))
    one_line(cli("train", "--split", split, "--output", tmp_path / "model", *SMALL),
             "train", "dataset_manifest.json: 'train_row_groups': expected")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["split"]


# ---- report: trials.jsonl as a hand may have edited it

@pytest.mark.parametrize("where", ["val", "val_stderr"])
def test_a_trial_with_a_nan_metric_is_one_line(cli, tmp_path: Path, where: str) -> None:
    keys = ("ndcg_at_100", "recall_at_20", "recall_at_50")
    trials = [{"trial": i, "params": {"hidden": 600}, "val": dict.fromkeys(keys, 0.4 + i / 10),
               "val_stderr": dict.fromkeys(keys, 0.01)} for i in range(2)]
    trials[1][where]["ndcg_at_100"] = float("nan")
    path = tmp_path / "trials.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in trials))
    one_line(cli("report", "--trials", path, "--output", tmp_path / "report"), "report",
             f"{path}: line 2: ")
    assert not (tmp_path / "report").exists()


# ---- the Spark engine: one line on stderr, and its files kept with the stage's

@pytest.mark.slow
def test_spark_keeps_its_jvm_banner_and_local_dirs_to_the_stage(cli, tmp_path: Path) -> None:
    """A session vaecf starts itself (a process of its own: the suite's session would be
    reused in process) prints its JVM's banner nowhere near stderr, and puts Spark's local
    dirs in the stage's staging area, which a killed run's successor removes."""
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,2,3.0,4\n"
                                          "1,3,x,5\n")
    assert cli("download", "--dataset", "movielens", "--source", tmp_path / "ratings.csv",
               "--output", tmp_path / "raw")[0] == 0
    (tmp_path / "tmp").mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_HOME", "MASTER", "SPARK_CONF_DIR", "SPARK_LOCAL_DIRS")}
    done = subprocess.run(
        [sys.executable, "-m", "vaecf.cli", "preprocess", "--input", str(tmp_path / "raw"),
         "--output", str(tmp_path / "out"), "--engine", "spark"],
        env={**env, "TMPDIR": str(tmp_path / "tmp"), "PYSPARK_PYTHON": sys.executable},
        capture_output=True, text=True, timeout=600)
    assert (done.returncode, done.stderr) == (
        1, "vaecf preprocess: error: ratings.csv: line 3: column 'rating': 'x' is not a "
           "number\n"), done.stdout[-3000:]
    local = done.stdout.split("local dirs in ", 1)[1].split("\n", 1)[0]
    assert Path(local).parent.name.startswith(".out.staging-") and Path(local).parent.parent \
        == tmp_path, local
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ratings.csv", "raw", "tmp"]
    assert list((tmp_path / "tmp").iterdir()) == []
