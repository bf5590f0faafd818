"""``vaecf`` in a slim image: stages whose heavy dependency is missing are not listed and fail
with one line naming the image that runs them (the data image has no TensorFlow)."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture
def without_tensorflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``tensorflow`` unimportable, as in the data and launcher images."""
    monkeypatch.setitem(sys.modules, "tensorflow", None)


def test_help_lists_only_runnable_stages(cli, without_tensorflow) -> None:
    code, out, _ = cli("--help")
    assert code == 0
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  ")]
    assert "download" in listed and "split" in listed
    assert not {"train", "evaluate", "recommend", "benchmark", "demo"} & set(listed)


def test_missing_dependency_is_one_line_naming_the_image(cli, without_tensorflow) -> None:
    code, out, err = cli("train", "--help")
    assert code == 1 and out == ""
    assert err == ("vaecf: error: stage 'train' needs tensorflow, which this image lacks; "
                   "run it in vaecf-train\n")


def test_help_lists_every_stage_with_all_dependencies(cli) -> None:
    from vaecf.cli import STAGES

    _, out, _ = cli("--help")
    assert [line.split()[0] for line in out.splitlines() if line.startswith("  ")] == list(STAGES)
