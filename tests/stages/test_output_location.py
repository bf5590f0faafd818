"""The output-location rule, as a hostile user tries it: a stage publishes only into a new or
empty location or over its own previous output, never over anything else, locally and on S3;
concurrent publishers and killed runs leave no damage and no debris."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from vaecf.io import storage

USERS_ITEMS = ("--synthetic-users", "300", "--synthetic-items", "120")


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real ``vaecf download`` output (small synthetic data); read-only."""
    from vaecf.cli import main

    out = tmp_path_factory.mktemp("raw") / "raw"
    assert main(["download", "--dataset", "synthetic", *USERS_ITEMS, "--output", str(out)]) == 0
    return out


def tree(path: Path) -> dict[str, bytes]:
    """Every file below ``path`` with its bytes (a snapshot to compare after a refusal)."""
    return {p.relative_to(path).as_posix(): p.read_bytes()
            for p in sorted(path.rglob("*")) if p.is_file()}


def refused(result: tuple[int, str, str], stage: str, *expected: str) -> None:
    code, _, err = result
    assert code == 1, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"vaecf {stage}: error: ")
    for text in expected:
        assert text in err, err


def test_an_existing_file_is_not_replaced(cli, raw: Path, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    refused(cli("preprocess", "--input", raw, "--output", notes), "preprocess",
            str(notes), "not a folder")
    assert notes.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_folder_of_the_users_files_is_not_replaced(cli, raw: Path, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "sub" / "thesis.txt").write_text("years of work")
    refused(cli("preprocess", "--input", raw, "--output", f"{docs}/"), "preprocess",
            "not empty and not a previous output with preprocess_manifest.json")
    assert tree(docs) == {"sub/thesis.txt": b"years of work"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs"]


def test_an_output_that_holds_the_input_is_refused(cli, raw: Path, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    assert cli("preprocess", "--input", raw, "--output", proj / "inter")[0] == 0
    (proj / "mydocs").mkdir()
    (proj / "mydocs" / "thesis.txt").write_text("mine")
    before = tree(proj)
    refused(cli("split", "--input", proj / "inter", "--output", proj), "split",
            "would replace this stage's input")
    assert tree(proj) == before


@pytest.mark.parametrize("stage", ["preprocess", "split", "train", "recommend"])
def test_output_equal_to_input_is_refused(cli, raw: Path, synthetic_split, tmp_path: Path,
                                          stage: str) -> None:
    if stage == "preprocess":
        where = tmp_path / "raw"
        assert cli("download", "--dataset", "synthetic", *USERS_ITEMS, "--output", where)[0] == 0
        argv = ["--input", where, "--output", where]
    elif stage == "split":
        where = tmp_path / "inter"
        assert cli("preprocess", "--input", raw, "--output", where)[0] == 0
        argv = ["--input", where, "--output", where]
    elif stage == "train":
        where = tmp_path / "split"
        assert cli("preprocess", "--input", raw, "--output", tmp_path / "inter")[0] == 0
        assert cli("split", "--input", tmp_path / "inter", "--output", where)[0] == 0
        argv = ["--split", where, "--output", where, "--epochs", "1"]
    else:
        where = tmp_path / "model"
        split = synthetic_split()
        assert cli("train", "--split", split, "--output", where, "--epochs", "1",
                   "--batch-size", "100", "--hidden", "16", "--latent", "8")[0] == 0
        users = tmp_path / "users.csv"
        users.write_text("user_id,item_id\n1,3\n")
        argv = ["--model", where, "--input", users, "--output", where]
    before = tree(where)
    refused(cli(stage, *argv), stage, "would replace this stage's input")
    assert tree(where) == before


@pytest.mark.parametrize("output", [".", "..", "./", "../"])
def test_dot_and_dotdot_are_refused(cli, raw: Path, tmp_path: Path, monkeypatch,
                                    output: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    refused(cli("preprocess", "--input", raw, "--output", output), "preprocess",
            "never a stage's output")
    assert list(work.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["work"]


def test_the_working_directory_by_name_is_refused(cli, raw: Path, tmp_path: Path,
                                                  monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    refused(cli("preprocess", "--input", raw, "--output", tmp_path), "preprocess",
            "working directory")


def test_another_stages_output_is_refused(cli, raw: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-raw"
    assert cli("download", "--dataset", "synthetic", *USERS_ITEMS, "--output", other)[0] == 0
    before = tree(other)
    refused(cli("preprocess", "--input", raw, "--output", other), "preprocess",
            "preprocess_manifest.json")
    assert tree(other) == before


def test_a_previous_output_is_replaced_but_not_with_a_users_file_in_it(
        cli, raw: Path, tmp_path: Path) -> None:
    out = tmp_path / "inter"
    assert cli("preprocess", "--input", raw, "--output", out)[0] == 0
    first = tree(out)
    assert cli("preprocess", "--input", raw, "--output", out)[0] == 0  # its own: replaced
    assert tree(out).keys() == first.keys()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inter"]  # no staging, lock or old
    (out / "notes.txt").write_text("mine")
    refused(cli("preprocess", "--input", raw, "--output", out), "preprocess", "not empty")
    assert (out / "notes.txt").read_text() == "mine"


def test_a_failed_run_creates_no_parent_folders(cli, tmp_path: Path) -> None:
    missing_input = tmp_path / "nope"
    code, _, _ = cli("preprocess", "--input", missing_input, "--output", tmp_path / "a/b/c")
    assert code == 1
    assert list(tmp_path.iterdir()) == []


def test_a_successful_run_creates_the_parent_folders(cli, raw: Path, tmp_path: Path) -> None:
    assert cli("preprocess", "--input", raw, "--output", tmp_path / "a/b/c")[0] == 0
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["c"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


PUBLISHER = textwrap.dedent("""
    import os, sys, time
    from vaecf.errors import VaecfError
    from vaecf.io import publish, scratch, write_manifest
    try:
        with publish(sys.argv[1], "toy_manifest.json") as staging, scratch(staging) as tmp:
            (tmp / "extracted").write_bytes(b"x" * 1000)
            (staging / "data.bin").write_text(sys.argv[2])
            print("ready", flush=True)
            if sys.argv[3].startswith("/"):  # hold on until the test creates this file
                deadline = time.monotonic() + 300
                while not os.path.exists(sys.argv[3]):
                    if time.monotonic() > deadline:
                        sys.exit(3)
                    time.sleep(0.05)
            else:
                time.sleep(float(sys.argv[3]))
            write_manifest(staging, "toy", inputs={}, parameters={}, counts={}, started=0.0)
    except VaecfError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
""")


def publisher(target: Path, tag: str, seconds: float | Path, env: dict[str, str]
              ) -> subprocess.Popen[str]:
    """A process publishing ``tag`` to ``target`` after ``seconds`` (or once that file exists)."""
    return subprocess.Popen([sys.executable, "-c", PUBLISHER, str(target), tag, str(seconds)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_concurrent_publishers_one_wins_the_others_fail_with_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    for trial in range(4):
        target = tmp_path / f"out{trial}"
        processes = [publisher(target, str(n), 1.0, env) for n in range(3)]
        results = [(p.wait(timeout=60), p.stdout.read(), p.stderr.read())  # type: ignore[union-attr]
                   for p in processes]
        winners = [n for n, (code, _, _) in enumerate(results) if code == 0]
        assert len(winners) >= 1, results
        for code, _, err in results:
            assert code in (0, 1), err
            if code == 1:
                assert err.strip().splitlines() == [
                    f"error: {target}: another vaecf stage is writing this output now; "
                    "nothing was written"], err
        assert (target / "data.bin").read_text() in {str(n) for n in winners}
        assert json.loads((target / "toy_manifest.json").read_text())["stage"] == "toy"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"out{n}" for n in range(4)]


def test_a_killed_publishers_debris_is_removed_by_the_next_run(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    target = tmp_path / "out"
    victim = publisher(target, "killed", 60.0, env)
    assert victim.stdout.readline() == "ready\n"  # type: ignore[union-attr]
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    debris = sorted(p.name for p in tmp_path.iterdir() if p.name != "tmp")
    assert any(name.startswith(".out.staging-") for name in debris), debris
    survivor = publisher(target, "second", 0.0, env)
    assert survivor.wait(timeout=60) == 0, survivor.stderr.read()  # type: ignore[union-attr]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tmp"]
    assert (target / "data.bin").read_text() == "second"
    assert list(temp.iterdir()) == []


def test_an_s3_downloads_debris_is_removed_by_the_next_run(tmp_path: Path, s3_bucket: str
                                                          ) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    uri = f"s3://{s3_bucket}/out"
    victim = publisher(uri, "killed", 60.0, env)  # type: ignore[arg-type]
    assert victim.stdout.readline() == "ready\n"  # type: ignore[union-attr]
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    assert [p.name.split("-")[:2] for p in temp.iterdir()] == [["vaecf", "publish"]]
    survivor = publisher(uri, "second", 0.0, env)  # type: ignore[arg-type]
    assert survivor.wait(timeout=60) == 0, survivor.stderr.read()  # type: ignore[union-attr]
    assert list(temp.iterdir()) == []
    assert storage.list_keys(uri) == ["_SUCCESS", "data.bin", "toy_manifest.json"]


@pytest.fixture()
def s3_raw(cli, raw: Path, s3_bucket: str) -> str:
    """The download output published under ``s3://<bucket>/run1/raw``."""
    uri = f"s3://{s3_bucket}/run1/raw"
    storage.upload_dir(raw, uri, first="download_manifest.json")
    return uri


def bucket_objects(bucket: str) -> dict[str, bytes]:
    s3 = boto3.client("s3")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    return {k: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in sorted(keys)}


@pytest.mark.parametrize("output", ["s3://{b}", "s3://{b}/", "s3://{b}/run1",
                                    "s3://{b}/run1/raw", "s3://{b}/run1/raw/inner",
                                    "s3://{b}/foreign"])
def test_s3_outputs_that_are_not_the_stages_own_are_refused(cli, s3_raw: str, s3_bucket: str,
                                                           output: str) -> None:
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="foreign/keep.txt", Body=b"mine")
    before = bucket_objects(s3_bucket)
    refused(cli("preprocess", "--input", s3_raw, "--output", output.format(b=s3_bucket)),
            "preprocess")
    assert bucket_objects(s3_bucket) == before


def test_s3_replacing_a_previous_output_deletes_only_its_objects(cli, s3_raw: str,
                                                                 s3_bucket: str) -> None:
    out = f"s3://{s3_bucket}/run1/inter"
    assert cli("preprocess", "--input", s3_raw, "--output", out)[0] == 0
    first = bucket_objects(s3_bucket)
    assert cli("preprocess", "--input", s3_raw, "--output", out)[0] == 0
    assert bucket_objects(s3_bucket).keys() == first.keys()
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="run1/inter/notes.txt", Body=b"mine")
    refused(cli("preprocess", "--input", s3_raw, "--output", out), "preprocess", "not empty")
    assert bucket_objects(s3_bucket)["run1/inter/notes.txt"] == b"mine"


def test_an_s3_checksum_error_names_the_s3_key(cli, s3_raw: str, s3_bucket: str,
                                               tmp_path: Path) -> None:
    out = f"s3://{s3_bucket}/run1/inter"
    assert cli("preprocess", "--input", s3_raw, "--output", out)[0] == 0
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="run1/inter/interactions.parquet",
                                  Body=b"tampered")
    refused(cli("split", "--input", out, "--output", tmp_path / "split"), "split",
            f"{out}/interactions.parquet: SHA-256 does not match")
    assert not (tmp_path / "split").exists()


@pytest.mark.parametrize("extra", ["link", "dangling-link", "empty-folder"])
def test_a_previous_output_plus_anything_unlisted_is_refused(cli, raw: Path, tmp_path: Path,
                                                             extra: str) -> None:
    out = tmp_path / "inter"
    assert cli("preprocess", "--input", raw, "--output", out)[0] == 0
    if extra == "link":
        (out / "mine").symlink_to(tmp_path)
    elif extra == "dangling-link":
        (out / "mine").symlink_to(tmp_path / "nowhere")
    else:
        (out / "mine").mkdir()
    before = tree(out)
    refused(cli("preprocess", "--input", raw, "--output", out), "preprocess", "not empty")
    assert tree(out) == before and os.path.lexists(out / "mine")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inter"]


@contextlib.contextmanager
def held_publisher(target: Path | str, tag: str, tmp_path: Path
                   ) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A publisher of ``target`` that has staged its output and waits for the yielded file
    (killed when the block fails)."""
    (ctl := tmp_path / "ctl").mkdir(exist_ok=True)
    release = ctl / f"release-{tag}"
    live = publisher(target, tag, release, {**os.environ, "TMPDIR": str(ctl)})  # type: ignore[arg-type]
    try:
        assert live.stdout.readline() == "ready\n"  # type: ignore[union-attr]
        yield live, release
    except BaseException:
        live.kill()
        raise
    finally:
        live.wait(timeout=60)


@pytest.mark.parametrize("pattern", ["o*", "o?", "o[0-9]"])
def test_an_output_name_is_not_a_pattern_for_another_runs_debris(tmp_path: Path,
                                                                 pattern: str) -> None:
    (work := tmp_path / "work").mkdir()
    with held_publisher(work / "o1", "live", tmp_path) as (live, release):
        other = publisher(work / pattern, "other", 0.0, {**os.environ, "TMPDIR": str(tmp_path)})
        assert other.wait(timeout=60) == 0, other.stderr.read()  # type: ignore[union-attr]
        release.touch()
        assert live.wait(timeout=60) == 0, live.stderr.read()  # type: ignore[union-attr]
    assert (work / "o1" / "data.bin").read_text() == "live"
    assert sorted(p.name for p in work.iterdir()) == sorted(["o1", pattern])


def test_an_output_inside_another_runs_staging_area_is_refused(cli, raw: Path,
                                                               tmp_path: Path) -> None:
    (work := tmp_path / "work").mkdir()
    with held_publisher(work / "o1", "live", tmp_path) as (live, release):
        [area] = [p for p in work.iterdir() if p.name.startswith(".o1.staging-")]
        before = tree(area)
        refused(cli("preprocess", "--input", raw, "--output", area / "evil"), "preprocess",
                "inside the working area of another vaecf run")
        assert tree(area) == before and not (area / "evil").exists()
        release.touch()
        assert live.wait(timeout=60) == 0, live.stderr.read()  # type: ignore[union-attr]
    assert sorted(p.name for p in work.iterdir()) == ["o1"]


def test_a_second_s3_publisher_stops_with_one_line(tmp_path: Path, s3_bucket: str) -> None:
    uri = f"s3://{s3_bucket}/out"
    with held_publisher(uri, "first", tmp_path) as (first, release):
        env = {**os.environ, "TMPDIR": str(tmp_path)}
        second = publisher(uri, "second", 0.0, env)  # type: ignore[arg-type]
        assert second.wait(timeout=60) == 1
        [line] = second.stderr.read().strip().splitlines()  # type: ignore[union-attr]
        assert line.startswith(f"error: {uri}: another vaecf stage is writing this output now "
                               f"(pid {first.pid} on "), line
        release.touch()
        assert first.wait(timeout=60) == 0, first.stderr.read()  # type: ignore[union-attr]
    assert bucket_objects(s3_bucket)["out/data.bin"] == b"first"
    assert sorted(bucket_objects(s3_bucket)) == ["out/_SUCCESS", "out/data.bin",
                                                 "out/toy_manifest.json"]


KILLED_AFTER_MANIFEST = textwrap.dedent("""
    import os, signal, sys
    from vaecf.io import publish, storage, write_manifest
    upload = storage.upload_file
    def upload_then_die(src, uri):
        upload(src, uri)
        if uri.endswith("_manifest.json") and sys.argv[2] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
    storage.upload_file = upload_then_die
    with publish(sys.argv[1], "toy_manifest.json") as staging:
        for name in sys.argv[3:]:
            (staging / name).write_text(sys.argv[2])
        write_manifest(staging, "toy", inputs={}, parameters={}, counts={}, started=0.0)
""")


def test_an_s3_replace_killed_after_its_manifest_is_replaced_by_the_next_run(
        tmp_path: Path, s3_bucket: str) -> None:
    uri = f"s3://{s3_bucket}/out"
    env = {**os.environ, "TMPDIR": str(tmp_path)}

    def run(tag: str, *files: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", KILLED_AFTER_MANIFEST, uri, tag, *files],
                              capture_output=True, text=True, env=env, timeout=120)

    assert run("old", "data.bin", "top_k.parquet").returncode == 0
    assert run("kill", "data.bin").returncode == -signal.SIGKILL
    assert "out/_SUCCESS" not in bucket_objects(s3_bucket)
    result = run("new", "data.bin")
    assert result.returncode == 0, result.stderr
    objects = bucket_objects(s3_bucket)
    assert sorted(objects) == ["out/_SUCCESS", "out/data.bin", "out/toy_manifest.json"]
    assert objects["out/data.bin"] == b"new"
    assert list(tmp_path.iterdir()) == []


def test_an_s3_output_holding_only_its_folder_marker_is_empty(cli, s3_raw: str,
                                                              s3_bucket: str) -> None:
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="run2/", Body=b"")
    code, _, err = cli("preprocess", "--input", s3_raw, "--output", f"s3://{s3_bucket}/run2")
    assert code == 0, err
    assert storage.list_keys(f"s3://{s3_bucket}/run2") == [
        "_SUCCESS", "interactions.parquet", "preprocess_manifest.json"]


@pytest.mark.parametrize("prefix,key", [("abs", "abs//{tmp}/evil"), ("up", "up/../../evil")])
def test_an_s3_input_key_that_leaves_its_prefix_writes_nothing(
        cli, raw: Path, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        prefix: str, key: str) -> None:
    temp = tmp_path / "t"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # "../../evil" from $TMPDIR/vaecf-*/
    storage.upload_dir(raw, f"s3://{s3_bucket}/{prefix}", first="download_manifest.json")
    evil = key.format(tmp=tmp_path)
    boto3.client("s3").put_object(Bucket=s3_bucket, Key=evil, Body=b"owned")
    refused(cli("preprocess", "--input", f"s3://{s3_bucket}/{prefix}", "--output",
                tmp_path / "out"), "preprocess", f"s3://{s3_bucket}/{prefix}: ",
            evil.removeprefix(f"{prefix}/"), "is not a path inside its folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"] and list(temp.iterdir()) == []


def _unshare_works(*flags: str) -> bool:
    """Whether ``unshare <flags> true`` runs here (user and mount namespaces)."""
    try:
        return subprocess.run(["unshare", *flags, "true"], capture_output=True,
                              timeout=30).returncode == 0
    except OSError:
        return False


needs_mounts = pytest.mark.skipif(not _unshare_works("-Urm"), reason="mounting a small tmpfs as "
                                  "any user needs `unshare -Urm`, which this machine refuses")
VAECF = f"{sys.executable} -m vaecf.cli"


def in_namespace(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run bash ``script`` as root of new user and mount namespaces: it may mount a tmpfs,
    which nobody else sees and which vanishes with it."""
    return subprocess.run(["unshare", "-Urm", "bash", "-euc", script], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=300)


@needs_mounts
def test_an_output_that_is_a_mount_point_is_refused_before_any_work(raw: Path,
                                                                    tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    result = in_namespace(f"""
        mount -t tmpfs tmpfs "$OUT"
        code=0; {VAECF} preprocess --input "$RAW" --output "$OUT" || code=$?
        echo "code $code"; echo "holds:" $(ls -A "$OUT")
    """, RAW=str(raw), OUT=str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"vaecf preprocess: error: {tmp_path / 'out'}: is a mount point"), line
    assert result.stdout.splitlines() == ["code 1", "holds:"]  # no work, nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


FULL_DISK = """
    mount -t tmpfs -o size=2m tmpfs "$DISK"
    {vaecf} {argv} --output "$DISK/out" > /dev/null
    (cd "$DISK/out" && sha256sum *) > "$REPORT/before"
    cat /dev/zero > "$DISK/fill" 2> /dev/null || true
    code=0; {vaecf} {argv} --output "$DISK/out" > /dev/null 2> "$REPORT/stderr" || code=$?
    echo $code > "$REPORT/code"
    (cd "$DISK/out" && sha256sum *) > "$REPORT/after"
    ls -A "$DISK" > "$REPORT/listing"
"""


@needs_mounts
@pytest.mark.parametrize("stage", ["download", "preprocess", "split"])
def test_a_full_disk_is_one_line_and_keeps_the_previous_output(cli, raw: Path, tmp_path: Path,
                                                               stage: str) -> None:
    (disk := tmp_path / "disk").mkdir()
    (report := tmp_path / "report").mkdir()
    argv = {"download": f"download --dataset synthetic {' '.join(USERS_ITEMS)}",
            "preprocess": f"preprocess --input {raw}",
            "split": f"split --input {tmp_path / 'inter'}"}[stage]
    if stage == "split":
        assert cli("preprocess", "--input", raw, "--output", tmp_path / "inter")[0] == 0
    result = in_namespace(FULL_DISK.format(vaecf=VAECF, argv=argv), DISK=str(disk),
                          REPORT=str(report))
    assert result.returncode == 0, result.stderr
    assert (report / "code").read_text() == "1\n", (report / "stderr").read_text()
    [line] = (report / "stderr").read_text().strip().splitlines()
    assert line.startswith(f"vaecf {stage}: error: {disk}/out: No space left on device "
                           f"while writing in {disk}"), line
    assert (report / "after").read_text() == (report / "before").read_text() != ""
    assert (report / "listing").read_text().split() == ["fill", "out"]  # no staging, no lock


@needs_mounts
@pytest.mark.parametrize("side", ["input", "output"])
def test_a_full_tmpdir_under_an_s3_transfer_is_one_line(cli, raw: Path, s3_raw: str,
                                                        s3_bucket: str, tmp_path: Path,
                                                        side: str) -> None:
    (temp := tmp_path / "tmp").mkdir()
    if side == "input":
        out = str(tmp_path / "inter")
        argv = f"preprocess --input {s3_raw} --output {out}"
    else:
        out = f"s3://{s3_bucket}/run1/inter"
        argv = f"preprocess --input {raw} --output {out}"
    assert cli(*argv.split())[0] == 0  # the previous output
    before = bucket_objects(s3_bucket), tree(tmp_path)
    result = in_namespace(f"""
        mount -t tmpfs -o size=64k tmpfs "$TMPDIR"
        head -c 60k /dev/zero > "$TMPDIR/fill"  # 4 KiB left: Python's probe of $TMPDIR fits
        code=0; {VAECF} {argv} > /dev/null || code=$?
        echo "code $code"; echo "left:" $(ls -A "$TMPDIR")
    """, TMPDIR=str(temp))
    assert result.stdout.splitlines() == ["code 1", "left: fill"], result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("vaecf preprocess: error: "), line
    assert "No space left on device" in line and str(temp) in line
    assert (s3_raw if side == "input" else out) in line
    assert (bucket_objects(s3_bucket), tree(tmp_path)) == before


@pytest.mark.parametrize("code,line", [(28, "vaecf toy: error: /x/f: No space left on device"),
                                       (5, "vaecf toy: error: /x/f: Input/output error")])
def test_a_disk_error_outside_a_publish_is_one_line_too(capsys, code: int, line: str) -> None:
    from vaecf.stages import new_parser, run_stage

    def body(_: object) -> None:
        raise OSError(code, os.strerror(code), "/x/f")

    assert run_stage("toy", new_parser("toy", "toy"), [], body) == 1
    assert capsys.readouterr().err == line + "\n"
    def bug(_: object) -> None:
        raise FileNotFoundError(2, os.strerror(2), "/x/f")

    with pytest.raises(FileNotFoundError):  # not a disk error: a bug, shown in full
        run_stage("toy", new_parser("toy", "toy"), [], bug)


@pytest.mark.skipif(not _unshare_works("-U"), reason="needs `unshare -U` to drop privileges "
                    "over the test's own files")
def test_an_output_holding_a_folder_that_cannot_be_listed_is_refused(cli, raw: Path,
                                                                     tmp_path: Path) -> None:
    out = tmp_path / "inter"
    assert cli("preprocess", "--input", raw, "--output", out)[0] == 0
    (out / "private").mkdir(mode=0o000)
    try:  # in a new user namespace even root lacks the privilege to list it
        result = subprocess.run(["unshare", "-U", sys.executable, "-m", "vaecf.cli",
                                 "preprocess", "--input", raw, "--output", out],
                                capture_output=True, text=True, timeout=300)
    finally:  # wherever a wrong replace moved it
        for private in tmp_path.rglob("private"):
            private.chmod(0o755)
    assert result.returncode == 1, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line == (f"vaecf preprocess: error: {out}: holds {out / 'private'}, which cannot be "
                    "listed (Permission denied); nothing was written"), line
    assert (out / "private").is_dir() and sorted(p.name for p in tmp_path.iterdir()) == ["inter"]
