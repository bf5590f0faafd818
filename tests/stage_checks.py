"""Assertions shared by the stage tests (importable because tests/ is the rootdir)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def assert_failed(stage: str, result: tuple[int, str, str], output: Path,
                  *expected: str) -> None:
    """Exit 1, exactly one line on stderr naming the problem, nothing at the output."""
    code, _, err = result
    assert code == 1
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"vaecf {stage}: error: ")
    for text in expected:
        assert text in err
    assert not output.exists()


def tmpfs(tmp_path: Path, size: str) -> Iterator[Path]:
    """A fixture's body: a tmpfs of ``size`` (e.g. "16k") at ``tmp_path/disk``, unmounted after;
    the test is skipped where mounting is not allowed."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:  # not root, or no CAP_SYS_ADMIN (an unprivileged container)
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)
