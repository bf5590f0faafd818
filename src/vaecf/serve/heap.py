"""The server's heap after large requests: large blocks mapped apart, free pages given back.

glibc's malloc serves a block over its mmap threshold (128 KiB at start) from its own mapping,
returned to the system when freed; but once such a block is freed it raises the threshold to
that block's size (up to 32 MiB), so after one large answer the next ones come from the heap,
whose free pages it keeps. ``map_large_blocks_apart`` fixes the threshold, so request bodies,
answers and their write buffers (an unread answer included, once its client goes) always go
back; ``give_back`` returns the heap's free pages after a large request (``malloc_trim``,
0.1 ms measured). Elsewhere than glibc both do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)
MMAP_THRESHOLD = 256 * 2**10  # bytes: a block this size or larger gets its own mapping
GIVE_BACK_BYTES = 2**20  # a REST exchange this large is followed by ``give_back``
GIVE_BACK_PLACES = 2**16  # so are model calls that answered this many places (users x k)


@functools.cache
def _glibc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def map_large_blocks_apart() -> None:
    """Blocks of ``MMAP_THRESHOLD`` bytes or more in their own mapping, from now on."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def give_back() -> None:
    """The heap's free pages back to the system."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
