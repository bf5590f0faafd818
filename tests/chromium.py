"""Headless Chromium for the tests that render a page (the HTML report, the docs site).

Chromium is a prerequisite of `make test` (README, quick start; CI installs it). It runs with
a fresh profile and nothing that reaches out (no first-run, sync, component updates or
background networking), so a render depends on the page alone.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")


def executable() -> str:
    found = shutil.which("chromium")
    if found is None:  # a prerequisite of `make test` (README, quick start)
        pytest.fail("chromium not found on PATH: install it (Debian: sudo apt-get install "
                    "chromium) to render pages", pytrace=False)
    return found


def screenshot(target: str, shot: Path, profile: Path, width: int = 1200,
               height: int = 2000) -> np.ndarray:
    """Render ``target`` (a URL) into ``shot`` (PNG) with a fresh ``profile``; its pixels,
    float [height, width, channels] in 0..1."""
    from matplotlib.image import imread

    subprocess.run([executable(), *FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}",
                    f"--window-size={width},{height}", target],
                   check=True, capture_output=True, timeout=120)
    pixels: np.ndarray = imread(shot)
    return pixels
