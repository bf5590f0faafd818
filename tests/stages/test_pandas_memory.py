"""The pandas engine's peak memory grows with the positives by a bounded number of bytes each.

Each stage runs in a fresh process (its peak resident memory is its own), on two inputs of
the same shape, 250,000 and 1,250,000 positives; the difference of the peaks over the
difference of the positives is what a larger input costs per positive. Measured here on
2026-11-26: the previous version (whole raw columns read, every raw row factorised, sorts of
copies) 243 bytes per positive in preprocess and 99 in split; this one (a piece of the file at a
time, positives only, one int64 key sorted in place, dictionary-encoded ids) 67 and 56.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from vaecf.stages import download

ITEMS_PER_USER = 50
N_ITEMS = 2000
# Bytes per positive above which a stage's peak grows like the previous version's.
PREPROCESS_LIMIT = 120
SPLIT_LIMIT = 80


def _ratings_csv(path: Path, n_users: int) -> None:
    """``n_users`` x 50 distinct items of 2,000 (every item has many users), half of the
    ratings >= 4 stars: 25 positives per user."""
    users = np.repeat(np.arange(1, n_users + 1, dtype=np.int64), ITEMS_PER_USER)
    steps = np.tile(np.arange(ITEMS_PER_USER, dtype=np.int64) * 37, n_users)
    items = (users * 7 + steps) % N_ITEMS + 1  # 37 is prime to 2,000: 50 distinct items
    stars = np.tile(np.array(["4.5", "2.0"] * (ITEMS_PER_USER // 2)), n_users)
    table = pa.table({"userId": users, "movieId": items, "rating": stars,
                      "timestamp": np.zeros(len(users), dtype=np.int64)})
    pacsv.write_csv(table, path, pacsv.WriteOptions(quoting_style="none"))


def _peak_rss(stage: str, args: list[str]) -> int:
    """Peak resident bytes of a fresh process that runs ``vaecf <stage> args``."""
    # VmHWM, not getrusage's ru_maxrss: Linux carries the latter over from the forking
    # process (pytest's) into the new program.
    code = ("import sys\n"
            "import vaecf.data.readers.table as table\n"
            "table._PIECE_SIZE = 1 << 20  # pieces far smaller than the inputs\n"
            f"from vaecf.stages.{stage} import main\n"
            "assert main(sys.argv[1:]) == 0\n"
            "status = open('/proc/self/status').read()\n"
            "print(int(status.split('VmHWM:')[1].split()[0]) * 1024)\n")
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          check=True, timeout=600)
    return int(done.stdout.split()[-1])


def _peaks(directory: Path, n_users: int) -> tuple[int, int, int]:
    """(positives, preprocess peak, split peak) of ``n_users`` users' ratings."""
    directory.mkdir()
    _ratings_csv(directory / "ratings.csv", n_users)
    raw, positives, split = (directory / name for name in ("raw", "positives", "split"))
    assert download.main(["--dataset", "movielens", "--source",
                          str(directory / "ratings.csv"), "--output", str(raw)]) == 0
    preprocess_peak = _peak_rss("preprocess", ["--input", str(raw), "--output", str(positives)])
    split_peak = _peak_rss("split", ["--input", str(positives), "--output", str(split)])
    manifest = json.loads((positives / "preprocess_manifest.json").read_text())
    return manifest["counts"]["output"]["rows"], preprocess_peak, split_peak


def test_peak_memory_per_positive_is_bounded(tmp_path: Path) -> None:
    small = _peaks(tmp_path / "small", 10_000)
    large = _peaks(tmp_path / "large", 50_000)
    assert (small[0], large[0]) == (250_000, 1_250_000)
    per_positive = [(large[k] - small[k]) / (large[0] - small[0]) for k in (1, 2)]
    assert per_positive[0] < PREPROCESS_LIMIT, (small, large, per_positive)
    assert per_positive[1] < SPLIT_LIMIT, (small, large, per_positive)
