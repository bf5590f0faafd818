"""What this host can still give a process: the memory probe of training's size check and of
EASE's. It sits below both (beside ``log`` and ``errors``): neither layer owns it."""

from __future__ import annotations

from pathlib import Path

GIB = 2**30


def available_bytes() -> int | None:
    """Memory this process may still take: ``MemAvailable``, capped by a cgroup's limit
    (a container's); None where neither can be read (not Linux). Training's size check and
    EASE's use it."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError):
        pass
    for limit, usage in (("memory.max", "memory.current"),  # cgroup v2, then v1
                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            cap = (Path("/sys/fs/cgroup") / limit).read_text().strip()
            used = int((Path("/sys/fs/cgroup") / usage).read_text())
        except (OSError, ValueError):
            continue
        if cap.isdigit() and int(cap) < 2**60:  # v1 reports "no limit" as ~2**63
            found.append(max(0, int(cap) - used))
        break
    return min(found) if found else None
