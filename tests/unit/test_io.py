"""vaecf.io against a real S3 server on loopback and the local filesystem."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import pytest

from vaecf.errors import VaecfError
from vaecf.io import (
    locks,
    open_input,
    open_input_file,
    publish,
    read_manifest,
    storage,
    write_manifest,
)
from vaecf.io.paths import inside

TOY = "toy_manifest.json"


def _write_stage(staging: Path, payload: bytes) -> None:
    (staging / "data.bin").write_bytes(payload)
    (staging / "sub").mkdir()
    (staging / "sub" / "x.txt").write_text("x")
    write_manifest(staging, "toy", inputs={}, parameters={"a": 1}, counts={}, started=0.0)


def test_s3_round_trip_with_multipart(s3_bucket: str, tmp_path: Path) -> None:
    payload = os.urandom(9 * 1024 * 1024 + 17)  # above the 8 MiB multipart threshold
    uri = f"s3://{s3_bucket}/runs/one"
    with publish(uri, TOY) as staging:
        _write_stage(staging, payload)
    keys = storage.list_keys(uri)
    assert keys == ["_SUCCESS", "data.bin", "sub/x.txt", "toy_manifest.json"]
    with open_input(uri) as local:
        assert (local / "data.bin").read_bytes() == payload
        manifest = read_manifest(local, "toy")
        assert manifest["parameters"] == {"a": 1}
        assert set(manifest["files"]) == {"data.bin", "sub/x.txt"}


def test_s3_prefix_without_success_is_refused(s3_bucket: str) -> None:
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="half/data.bin", Body=b"123")
    with pytest.raises(VaecfError, match="no _SUCCESS marker"), \
            open_input(f"s3://{s3_bucket}/half"):
        pass


def test_s3_missing_key(s3_bucket: str, tmp_path: Path) -> None:
    with pytest.raises(VaecfError, match=r"s3://.*/nope\.zip: S3 error"):
        storage.download_file(f"s3://{s3_bucket}/nope.zip", tmp_path / "x")


def test_s3_republish_removes_the_previous_outputs_objects(s3_bucket: str) -> None:
    uri = f"s3://{s3_bucket}/out"
    with publish(uri, TOY) as staging:
        (staging / "old.txt").write_text("old")
        write_manifest(staging, "toy", inputs={}, parameters={}, counts={}, started=0.0)
    with publish(uri, TOY) as staging:
        (staging / "new.txt").write_text("new")
        write_manifest(staging, "toy", inputs={}, parameters={}, counts={}, started=0.0)
    assert storage.list_keys(uri) == ["_SUCCESS", "new.txt", TOY]


def test_s3_missing_bucket_fails_before_work(s3_bucket: str) -> None:
    ran = False
    with pytest.raises(VaecfError, match="no-such-bucket"), publish("s3://no-such-bucket/x", TOY):
        ran = True
    assert not ran


def test_local_publish_is_atomic(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with pytest.raises(RuntimeError), publish(str(target), TOY) as staging:
        (staging / "partial").write_text("half")
        raise RuntimeError("killed")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []
    with publish(str(target), TOY) as staging:
        _write_stage(staging, b"abc")
    with publish(str(target), TOY) as staging:  # replacing an older output
        _write_stage(staging, b"def")
    assert (target / "data.bin").read_bytes() == b"def"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_output_with_an_empty_folder_can_be_replaced_by_its_stage(tmp_path: Path) -> None:
    """A stage's empty folder (a SavedModel's ``assets/``) is not published, so the stage's
    next run still recognises the output as its own (an empty folder a user adds is not)."""
    target = tmp_path / "out"
    for payload in (b"abc", b"def"):
        with publish(str(target), TOY) as staging:
            _write_stage(staging, payload)
            (staging / "sub" / "assets" / "deeper").mkdir(parents=True)
    assert (target / "data.bin").read_bytes() == b"def"
    assert not (target / "sub" / "assets").exists()


def test_unwritable_output(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(VaecfError, match="not writable"), publish(str(blocker / "out"), TOY):
        pass


def test_manifest_detects_tampering(tmp_path: Path) -> None:
    with publish(str(tmp_path / "out"), TOY) as staging:
        _write_stage(staging, b"abc")
    out = tmp_path / "out"
    (out / "data.bin").write_bytes(b"abd")
    with pytest.raises(VaecfError, match=r"data\.bin: SHA-256 does not match"):
        read_manifest(out, "toy")
    (out / "toy_manifest.json").unlink()
    with pytest.raises(VaecfError, match="manifest missing"):
        read_manifest(out, "toy")


def test_manifest_is_deterministic_but_for_run(tmp_path: Path) -> None:
    docs = []
    for name in ("a", "b"):
        with publish(str(tmp_path / name), TOY) as staging:
            _write_stage(staging, b"same")
        doc = json.loads((tmp_path / name / "toy_manifest.json").read_text())
        doc.pop("run")
        docs.append(doc)
    assert docs[0] == docs[1]


def test_open_input_file_local_and_s3(s3_bucket: str, tmp_path: Path) -> None:
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="a/metrics.json", Body=b"{}")
    with open_input_file(f"s3://{s3_bucket}/a/metrics.json") as path:
        assert path.name == "metrics.json" and path.read_bytes() == b"{}"
    assert not path.exists()  # the download is temporary
    with pytest.raises(VaecfError, match=r"nope\.json: input file does not exist"), \
            open_input_file(str(tmp_path / "nope.json")):
        pass


@pytest.mark.parametrize("name", ["/home/u/.bashrc", "../x", "a/../../x", "a/..", "", "."])
def test_a_path_from_data_that_leaves_its_folder_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(VaecfError, match=r"where: .* is not a path inside its folder"):
        inside(tmp_path, name, "where")


def test_a_path_from_data_that_leaves_through_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").symlink_to("/")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(VaecfError, match="through a symbolic link"):
        inside(tmp_path, "out/etc/passwd", "where")
    with pytest.raises(VaecfError, match="'loop/x' cannot be resolved"):
        inside(tmp_path, "loop/x", "where")
    assert inside(tmp_path, "a//./b", "where") == tmp_path / "a" / "b"


@pytest.mark.parametrize("name", ["k" * 256, "a/" + "é" * 128 + "/b"])
def test_a_path_from_data_with_a_name_too_long_for_the_file_system_is_refused(
        tmp_path: Path, name: str) -> None:
    # Before: accepted, and the copy failed half-way with the file system's ENAMETOOLONG.
    with pytest.raises(VaecfError, match=r"where: '.*'\.\.\. \(\d+ characters\) has a name of "
                                         r"256 bytes \(at most 255\); refused"):
        inside(tmp_path, name, "where")
    assert inside(tmp_path, "k" * 255, "where") == tmp_path / ("k" * 255)


@pytest.mark.parametrize("prefix,key", [("abs", "abs//{tmp}/evil"), ("up", "up/../../evil")])
def test_an_s3_key_that_leaves_its_prefix_writes_nothing(s3_bucket: str, tmp_path: Path,
                                                        prefix: str, key: str) -> None:
    temp = tmp_path / "t"
    temp.mkdir()
    with publish(f"s3://{s3_bucket}/{prefix}", TOY) as staging:
        _write_stage(staging, b"abc")
    evil = key.format(tmp=tmp_path)
    boto3.client("s3").put_object(Bucket=s3_bucket, Key=evil, Body=b"owned")
    with pytest.raises(VaecfError, match=f"s3://{s3_bucket}/{prefix}: .*evil' is not a path"):
        storage.download_dir(f"s3://{s3_bucket}/{prefix}", temp / "in")
    assert not (tmp_path / "evil").exists() and list(temp.iterdir()) == []


def test_a_folder_marker_is_no_content(s3_bucket: str) -> None:
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="run1/", Body=b"")
    with publish(f"s3://{s3_bucket}/run1", TOY) as staging:
        _write_stage(staging, b"abc")
    assert storage.list_keys(f"s3://{s3_bucket}/run1") == ["_SUCCESS", "data.bin", "sub/x.txt",
                                                            TOY]


def test_outputs_whose_names_join_alike_have_distinct_locks(tmp_path: Path) -> None:
    with publish(str(tmp_path / "p" / "a-b"), TOY) as first:
        with publish(str(tmp_path / "p" / "a" / "b"), TOY) as second:
            _write_stage(second, b"2")
        _write_stage(first, b"1")
    assert (tmp_path / "p" / "a" / "b" / "data.bin").read_bytes() == b"2"
    assert (tmp_path / "p" / "a-b" / "data.bin").read_bytes() == b"1"
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["a", "a-b"]


@pytest.mark.parametrize("pattern", ["o*", "o?", "o[0-9]", "o1.staging-*"])
def test_an_output_name_is_never_a_pattern(tmp_path: Path, pattern: str) -> None:
    with publish(str(tmp_path / "o1"), TOY) as live:
        with publish(str(tmp_path / pattern), TOY) as other:
            _write_stage(other, b"other")
        assert live.is_dir()
        _write_stage(live, b"o1")
    assert (tmp_path / "o1" / "data.bin").read_bytes() == b"o1"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["o1", pattern])


OTHER_RUN = """
import sys
from vaecf.errors import VaecfError
from vaecf.io import publish
try:
    with publish(sys.argv[1], "toy_manifest.json"):
        pass
except VaecfError as err:
    print(err)
"""


def test_an_output_inside_another_runs_staging_is_refused(tmp_path: Path) -> None:
    with publish(str(tmp_path / "o1"), TOY) as live:
        other = subprocess.run([sys.executable, "-c", OTHER_RUN, str(live.parent / "evil")],
                               capture_output=True, text=True, check=True, timeout=120)
        assert "inside the working area of another vaecf run" in other.stdout
        assert sorted(p.name for p in live.parent.iterdir()) == ["out"]
        _write_stage(live, b"o1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o1"]


def test_a_stage_may_publish_inside_its_own_staging(tmp_path: Path) -> None:
    """``vaecf tune`` publishes each trial's model inside its own staging area."""
    with publish(str(tmp_path / "tuned"), TOY) as staging:
        with publish(str(staging / "trials" / "trial-000"), TOY) as nested:
            _write_stage(nested, b"trial")
        _write_stage(staging, b"tuned")
    assert (tmp_path / "tuned" / "trials" / "trial-000" / "data.bin").read_bytes() == b"trial"


def test_a_long_name_is_published_or_refused_up_front(tmp_path: Path) -> None:
    longest = tmp_path / ("n" * 255)
    with publish(str(longest), TOY) as staging:  # the staging name is hashed to fit
        _write_stage(staging, b"abc")
    assert (longest / "data.bin").read_bytes() == b"abc"
    ran = False
    with pytest.raises(VaecfError, match="has a name of 256 bytes"), \
            publish(str(tmp_path / ("n" * 256)), TOY):
        ran = True
    deep = tmp_path.joinpath(*["d" * 200] * 20)
    with pytest.raises(VaecfError, match=r"is a path of \d+ bytes"), publish(str(deep), TOY):
        ran = True
    assert not ran and sorted(p.name for p in tmp_path.iterdir()) == ["n" * 255]


def test_a_second_s3_publisher_is_refused_while_the_first_holds_the_lease(
        s3_bucket: str) -> None:
    uri = f"s3://{s3_bucket}/out"
    with publish(uri, TOY) as staging:
        with pytest.raises(VaecfError, match="another vaecf stage is writing this output now"), \
                publish(uri, TOY):
            pass
        _write_stage(staging, b"first")
    assert storage.list_keys(uri) == ["_SUCCESS", "data.bin", "sub/x.txt", TOY]
    assert storage.list_keys(f"s3://{s3_bucket}") == ["out/_SUCCESS", "out/data.bin",
                                                      "out/sub/x.txt", f"out/{TOY}"]


def test_an_s3_lease_of_another_host_is_taken_over_only_once_stale(
        s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    holder = {"host": "elsewhere", "pid": 1, "time": 0}
    boto3.client("s3").put_object(Bucket=s3_bucket, Key=".out.lock",
                                  Body=json.dumps(holder).encode())
    uri = f"s3://{s3_bucket}/out"
    with pytest.raises(VaecfError, match=r"writing this output now \(pid 1 on elsewhere"), \
            publish(uri, TOY):
        pass
    monkeypatch.setattr(locks, "STALE_SECONDS", 0.0)
    with publish(uri, TOY) as staging:
        _write_stage(staging, b"abc")
    assert storage.list_keys(f"s3://{s3_bucket}") == ["out/_SUCCESS", "out/data.bin",
                                                      "out/sub/x.txt", f"out/{TOY}"]


def test_an_s3_server_that_ignores_conditional_writes_is_named(
        s3_bucket: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    put = locks.Lease._put
    with monkeypatch.context() as patched:
        patched.setattr(locks.Lease, "_put", lambda self, **condition: put(self))
        with publish(f"s3://{s3_bucket}/out", TOY) as staging:
            _write_stage(staging, b"abc")
    assert "this S3 server ignores conditional writes" in capsys.readouterr().err
    with publish(f"s3://{s3_bucket}/out", TOY) as staging:  # moto honours them
        _write_stage(staging, b"abc")
    assert capsys.readouterr().err == ""


def test_an_s3_lease_is_renewed_and_a_lost_one_publishes_nothing(
        s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(locks, "RENEW_SECONDS", 0.1)
    s3, uri = boto3.client("s3"), f"s3://{s3_bucket}/out"
    with publish(uri, TOY) as staging:
        first = s3.head_object(Bucket=s3_bucket, Key=".out.lock")["ETag"]
        time.sleep(0.5)
        assert s3.head_object(Bucket=s3_bucket, Key=".out.lock")["ETag"] != first
        _write_stage(staging, b"first")
    published = storage.list_keys(f"s3://{s3_bucket}")
    with pytest.raises(VaecfError, match="it took this run's lease over"), \
            publish(uri, TOY) as staging:
        _write_stage(staging, b"abc")
        s3.put_object(Bucket=s3_bucket, Key=".out.lock", Body=b"another run's")
        time.sleep(0.3)
    assert storage.list_keys(f"s3://{s3_bucket}") == [".out.lock", *published]
    assert s3.get_object(Bucket=s3_bucket, Key="out/data.bin")["Body"].read() == b"first"


@pytest.mark.parametrize("holder,taken", [
    ({"name": "a", "pid": "dead", "pids": "mine"}, True),
    ({"name": "b", "pid": "alive", "pids": "mine"}, False),
    ({"name": "c", "pid": "dead", "pids": "pid:[1]"}, False),  # a container of this host name
])
def test_an_s3_lease_of_this_host_is_taken_over_once_its_process_is_gone(
        s3_bucket: str, holder: dict[str, str], taken: bool) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    body = {"host": socket.gethostname(), "time": time.time(),
            "pid": int(dead) if holder["pid"] == "dead" else os.getpid(),
            "pids": os.readlink("/proc/self/ns/pid") if holder["pids"] == "mine"
            else holder["pids"]}
    name = holder["name"]
    boto3.client("s3").put_object(Bucket=s3_bucket, Key=f".{name}.lock",
                                  Body=json.dumps(body).encode())
    if taken:
        with publish(f"s3://{s3_bucket}/{name}", TOY) as staging:
            _write_stage(staging, b"abc")
        assert f".{name}.lock" not in storage.list_keys(f"s3://{s3_bucket}")
    else:
        with pytest.raises(VaecfError, match=f"now \\(pid {body['pid']} on "), \
                publish(f"s3://{s3_bucket}/{name}", TOY):
            pass
        assert not storage.list_keys(f"s3://{s3_bucket}/{name}")


DOTS = "'.', '..' and '//' are never part of an S3 output prefix"


@pytest.mark.parametrize("prefix,why", [("a/../b", DOTS), ("a/./b", DOTS), ("a//b", DOTS),
                                        ("p" * 770, "prefix of 770 bytes")])
def test_an_s3_output_prefix_s3_cannot_hold_as_named_is_refused(s3_bucket: str, prefix: str,
                                                                 why: str) -> None:
    with pytest.raises(VaecfError, match=re.escape(why)), \
            publish(f"s3://{s3_bucket}/{prefix}", TOY):
        pass
    assert storage.list_keys(f"s3://{s3_bucket}") == []


def test_a_run_that_began_before_the_parent_folders_existed_still_holds_the_output(
        tmp_path: Path) -> None:
    target = tmp_path / "p" / "a" / "b"
    with publish(str(target), TOY) as first:
        (tmp_path / "p" / "a").mkdir(parents=True)  # as another output below p/a would
        with pytest.raises(VaecfError, match="another vaecf stage is writing this output"), \
                publish(str(target), TOY):
            pass
        _write_stage(first, b"first")
    assert (target / "data.bin").read_bytes() == b"first"
    with publish(str(target), TOY) as again:  # the lock is gone with its holder
        _write_stage(again, b"again")
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["a"]


def _blocked_signals(thread: threading.Thread) -> set[int]:
    """The signals ``thread`` blocks, from its /proc status (SigBlk, a hex mask)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("SigBlk:")), 16)
    return {number for number in range(1, 65) if mask >> (number - 1) & 1}


def test_the_s3_lease_renewal_leaves_sigterm_and_sigint_to_the_main_thread(
        s3_bucket: str) -> None:
    """A signal the renewal thread took would not interrupt the main thread's blocking read
    (``launch-mpijob`` watching its job with an S3 output): the cancellation would wait."""
    from vaecf.io import locks

    held = locks.Lease(f"s3://{s3_bucket}/out")
    held.acquire()
    try:
        assert {signal.SIGTERM, signal.SIGINT} <= _blocked_signals(held._thread)
        assert not {signal.SIGTERM, signal.SIGINT} & signal.pthread_sigmask(signal.SIG_BLOCK,
                                                                            set())
    finally:
        held.release()
