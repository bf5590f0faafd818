"""Assertions shared by the stage tests (importable because tests/ is the rootdir)."""

from __future__ import annotations

from pathlib import Path


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
