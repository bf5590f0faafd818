"""Background threads that leave SIGTERM and SIGINT to the main thread.

A process-directed signal goes to any thread that does not block it. Python runs handlers
only in the main thread, and only between bytecodes: a signal taken by a helper thread does not
interrupt the main thread's blocking read (an MPIJob watch, an S3 transfer), so a cancelled run
would go on until that read returned (seen in CI under load). A thread started here inherits a
mask that blocks both, so they always reach the main thread.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def start_daemon(target: Callable[..., Any], *args: Any) -> threading.Thread:
    """Start ``target(*args)`` in a daemon thread with SIGTERM and SIGINT blocked."""
    thread = threading.Thread(target=target, args=args, daemon=True)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return thread
