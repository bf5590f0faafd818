"""The one .dockerignore admits what the Dockerfiles copy and keeps everything else out of
every build context (all images are built from the repository root)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def to_regex(pattern: str) -> str:
    """Docker's pattern syntax: `**/` any folders, `*` and `?` within one path element."""
    tokens = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
    regex, i = "", 0
    while i < len(pattern):
        token = next((t for t in tokens if pattern.startswith(t, i)), None)
        regex += tokens[token] if token else re.escape(pattern[i])
        i += len(token) if token else 1
    return regex


def ignored(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    decision = False
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!")
        if any(re.fullmatch(to_regex(pattern), c) for c in candidates):
            decision = not negate
    return decision


def copied_sources() -> set[str]:
    sources = set()
    for dockerfile in (ROOT / "docker").glob("*.Dockerfile"):
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY ") and "--from=" not in line:
                sources.update(line.split()[1:-1])
    return sources


def test_every_copied_source_is_in_the_context() -> None:
    sources = copied_sources()
    assert {"requirements.lock", "src", "manifests/base/mpijob.yaml"} <= sources
    for source in sources:
        assert not ignored(source), source
    assert not ignored("src/vaecf/cli.py")


@pytest.mark.parametrize("path", [".venv", ".venv/bin/python", "demo-output", "build",
                                  "build/image-check/data", "src/vaecf.egg-info/PKG-INFO",
                                  ".git", "tests/unit/test_cli.py", "data/raw",
                                  "src/vaecf/__pycache__/cli.cpython-311.pyc",
                                  "manifests/base/rbac.yaml", "Makefile"])
def test_everything_else_stays_out(path: str) -> None:
    assert ignored(path)
