"""Logging for people and machines: one line per event, progress that suits the terminal.

Only Horovod rank 0 logs; every other rank is silent (``set_quiet``). In a log (stdout not a
terminal: files, containers, KFP) a progress bar prints one line when its work is finished,
plus a line every ``interval`` seconds only if the work takes longer than that.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

_quiet = False
_summarised = False


def set_quiet(quiet: bool) -> None:
    """Silence this process (used on Horovod ranks other than 0)."""
    global _quiet
    _quiet = quiet


@contextlib.contextmanager
def summarised() -> Iterator[None]:
    """Inside, progress bars print no closing line in a log: the caller logs one line for the
    whole unit of work instead (a training epoch: its steps and its validation)."""
    global _summarised
    previous, _summarised = _summarised, True
    try:
        yield
    finally:
        _summarised = previous


def info(message: str) -> None:
    """Print one line on stdout, flushed, unless this process is quiet."""
    if not _quiet:
        print(message, flush=True)


def warning(message: str) -> None:
    """Print one line on stderr, flushed (something the user should know; the stage goes on)."""
    if not _quiet:
        print(message, file=sys.stderr, flush=True)


class Progress:
    """Progress of a long task of known (or unknown) size.

    On a terminal it redraws one line in place; elsewhere (CI, Kubernetes logs) it prints one
    plain line when closed, and before that a line every ``interval`` seconds of work, so a
    short task is one line and a long one shows it is alive.
    """

    def __init__(self, description: str, total: float | None = None, unit: str = "",
                 interval: float = 5.0) -> None:
        self.description = description
        self.total = total
        self.unit = unit
        self.done = 0.0
        self._interval = interval
        self._tty = sys.stdout.isatty()
        self._start = time.monotonic()
        self._last = self._start  # a log line only once a full interval has passed
        self._shown: float | None = None  # ``done`` as last printed in a log

    def update(self, amount: float) -> None:
        self.done += amount
        now = time.monotonic()
        if now - self._last >= (0.2 if self._tty else self._interval):
            self._last = now
            self._draw(final=False)

    def close(self) -> None:
        if self._tty or not (_summarised or self._shown == self.done):
            self._draw(final=True)

    def _draw(self, final: bool) -> None:
        if _quiet:
            return
        self._shown = self.done
        elapsed = max(time.monotonic() - self._start, 1e-9)
        if self.total:
            text = (f"{self.description}: {self.done:,.0f}/{self.total:,.0f} {self.unit} "
                    f"({100.0 * self.done / self.total:.0f}%, {elapsed:.1f}s)")
        else:
            text = f"{self.description}: {self.done:,.0f} {self.unit} ({elapsed:.1f}s)"
        if self._tty:
            print("\r" + text, end="\n" if final else "", flush=True)
        else:
            print(text, flush=True)


def progress(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate over ``items`` while reporting progress."""
    bar = Progress(description, total)
    for item in items:
        yield item
        bar.update(1)
    bar.close()


# Seconds between heartbeat lines (``heartbeat``); tests shorten it.
HEARTBEAT_SECONDS = 5.0
# The heartbeat's helper: a line every few seconds until its parent is gone or kills it.
_BEAT = ("import os, sys, time\n"
         "parent, every, text = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]\n"
         "start = time.monotonic()\n"
         "while True:\n"
         "    time.sleep(every)\n"
         "    if os.getppid() != parent:\n"
         "        break\n"
         "    print(f'{text}: running ({time.monotonic() - start:.0f}s)', flush=True)\n")


@contextlib.contextmanager
def heartbeat(description: str) -> Iterator[None]:
    """Show that one long call that reports nothing itself is alive, then log its end.

    For a LAPACK factorisation: scipy's wrappers hold the GIL for the whole call (measured: a
    thread ticking every 50 ms ran twice during a 3 s ``dpotrf``), so a thread cannot print.
    A small helper process prints ``<description>: running (Ns)`` every ``HEARTBEAT_SECONDS``
    on this process' stdout instead; it is stopped at the end and exits on its own if this
    process dies.
    """
    started = time.monotonic()
    helper = None
    if not _quiet:
        sys.stdout.flush()
        try:
            stdout: int | None = sys.stdout.fileno()
        except (AttributeError, OSError, io.UnsupportedOperation):
            stdout = None  # an in-process capture: the helper writes to file descriptor 1
        helper = subprocess.Popen(
            [sys.executable, "-S", "-c", _BEAT, str(os.getpid()), str(HEARTBEAT_SECONDS),
             description], stdin=subprocess.DEVNULL, stdout=stdout, close_fds=True)
    try:
        yield
    finally:
        if helper is not None:
            helper.kill()
            helper.wait()
        info(f"{description}: done ({time.monotonic() - started:.1f}s)")
