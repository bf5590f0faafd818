"""Progress in a log (stdout not a terminal): one line per finished unit of work (issue 13)."""

from __future__ import annotations

import pytest

from vaecf import log


def test_a_short_task_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    bar = log.Progress("evaluating", total=42, unit="users")
    bar.update(42)  # one update with everything: used to print, then print again on close
    bar.close()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("evaluating: 42/42 users (100%")


def test_a_long_task_shows_it_is_alive_without_repeating_the_end(
        capsys: pytest.CaptureFixture[str]) -> None:
    bar = log.Progress("download", total=10, unit="bytes", interval=0.0)  # every update
    for _ in range(10):
        bar.update(1)
    bar.close()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        f"download: {n}/10 bytes" for n in range(1, 11)]  # 10/10 once, not again on close


def test_inside_summarised_the_caller_logs_the_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    with log.summarised():
        bar = log.Progress("epoch 1", total=6, unit="steps")
        bar.update(6)
        bar.close()
        log.info("epoch 1: loss 1.0")
    bar = log.Progress("after", total=1)
    bar.update(1)
    bar.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "epoch 1: loss 1.0" and len(lines) == 2  # outside: a closing line again
    assert lines[1].startswith("after: 1/1")


def test_a_heartbeat_shows_a_call_that_holds_the_gil_is_alive(
        capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A LAPACK call holds the GIL, so a thread could not print; the helper process can."""
    import sys
    import time

    monkeypatch.setattr(log, "HEARTBEAT_SECONDS", 0.2)
    switch = sys.getswitchinterval()
    with log.heartbeat("inverting"):
        time.sleep(0.3)  # the helper starts
        sys.setswitchinterval(100.0)  # this thread now keeps the GIL, as LAPACK does
        try:
            end = time.monotonic() + 1.5
            while time.monotonic() < end:
                pass
        finally:
            sys.setswitchinterval(switch)
    lines = capfd.readouterr().out.splitlines()
    beats = [line for line in lines if line.startswith("inverting: running (")]
    assert len(beats) >= 3, lines
    assert lines[-1].startswith("inverting: done (") and len(lines) == len(beats) + 1
