"""Make the repository's ``components`` and ``pipelines`` packages importable in tests (they
are compile-time code, not part of the installed ``vaecf`` package)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
