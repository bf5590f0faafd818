"""One writer per output: a lock file for a local output, a lease object for an S3 prefix.

Local outputs use ``flock`` on ``.<name>.lock`` beside the output. S3 has no locks, but AWS S3
and MinIO (SeaweedFS since 3.97) honour a conditional write (``If-None-Match: *``): of two runs
creating the lease object ``.<name>.lock`` beside the prefix, exactly one succeeds; a server
that ignores the condition is caught by a second such write and named in a warning. The holder
renews it every ``RENEW_SECONDS`` (a write conditional on its own ETag, so a lease taken over
is noticed); a lease unrenewed for ``STALE_SECONDS`` by the server's clock, or one whose holder
ran on this host and is gone, belongs to a killed run and is taken over.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

from vaecf import log
from vaecf.errors import VaecfError
from vaecf.io import storage
from vaecf.io.readers import TEXT_LIMIT, parse_json
from vaecf.threads import start_daemon

RENEW_SECONDS = 20.0
STALE_SECONDS = 120.0


def busy(output: str, holder: str = "") -> VaecfError:
    return VaecfError(f"{output}: another vaecf stage is writing this output now{holder}; "
                      "nothing was written")


def lock_file(path: Path, output: str) -> int:
    """An exclusive, non-blocking lock on ``path``; one line if another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # The holder unlinks the file when done: a lock on an unlinked file guards nothing.
        if os.fstat(fd).st_ino != os.stat(path).st_ino:
            raise BlockingIOError
    except (BlockingIOError, FileNotFoundError):
        os.close(fd)
        raise busy(output) from None
    return fd


def lock_held(path: Path) -> bool:
    """Whether another process holds the lock ``lock_file`` takes on ``path`` (not taken)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the probe's own lock
    return False


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (signal 0 probes without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid_namespace() -> str:
    """This process's pid namespace (``pid:[4026531836]``): pids compare only within one."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def lease_key(uri: str) -> tuple[str, str]:
    """``s3://b/p/out`` -> ``("b", "p/.out.lock")``: beside the prefix, never inside it."""
    bucket, key = storage.split_s3(uri)
    parent, _, name = key.rpartition("/")
    return bucket, f"{parent}/.{name}.lock" if parent else f".{name}.lock"


class Lease:
    """The lease on one S3 output prefix, renewed by a daemon thread while held."""

    def __init__(self, output: str) -> None:
        self.output = output
        self.bucket, self.key = lease_key(output)
        self.s3 = storage.client()
        self.etag: str | None = None
        self.lost = False
        self._stop = threading.Event()

    def _put(self, **condition: str) -> str | None:
        """Write the lease under ``condition``; its new ETag, or None if the condition failed."""
        body = json.dumps({"host": socket.gethostname(), "pids": _pid_namespace(),
                           "pid": os.getpid(), "time": time.time()}).encode()
        try:
            return str(self.s3.put_object(Bucket=self.bucket, Key=self.key, Body=body,
                                          **condition)["ETag"])
        except Exception as err:  # botocore's ClientError and its transport errors
            code = getattr(err, "response", {}).get("Error", {}).get("Code")
            if code in ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey"):
                return None
            raise storage.describe(err, f"s3://{self.bucket}/{self.key}") from err

    def acquire(self) -> None:
        self.etag = self._put(IfNoneMatch="*")
        if self.etag is None:
            self._take_over_stale()
        probe = self._put(IfNoneMatch="*")  # must fail: the lease exists
        if probe is not None:
            self.etag = probe
            log.warning(f"vaecf: warning: {self.output}: this S3 server ignores conditional writes "
                        "(If-None-Match), so nothing stops two runs writing this output at once")
        self._thread = start_daemon(self._renew)  # SIGTERM stays the main thread's

    def _take_over_stale(self) -> None:
        """Delete a killed run's lease (conditional on its ETag) and create ours, or refuse."""
        try:
            found = self.s3.get_object(Bucket=self.bucket, Key=self.key)
        except Exception:  # vanished meanwhile, or not ours to read: try once more below
            found = None
        if found is not None:
            where = f"s3://{self.bucket}/{self.key}"
            try:
                holder: dict[str, Any] = parse_json(found["Body"].read(TEXT_LIMIT), where)
            except VaecfError:  # not a lease vaecf wrote: stale by age alone
                holder = {}
            now = parsedate_to_datetime(found["ResponseMetadata"]["HTTPHeaders"]["date"])
            age = (now - found["LastModified"]).total_seconds()
            here = holder.get("host") == socket.gethostname() and holder.get(
                "pids") == _pid_namespace()  # containers sharing a host name may not share pids
            pid = holder.get("pid")
            gone = (here and isinstance(pid, int) and 0 < pid < 2**31  # os.kill's range
                    and not pid_alive(pid))
            if not gone and age < STALE_SECONDS:
                # The server's time of the last renewal, not the holder's own clock (which a
                # lease edited, or written on a host whose clock is wrong, may put anywhere).
                since = found["LastModified"].astimezone().isoformat(timespec="seconds")
                raise busy(self.output, f" (pid {str(holder.get('pid'))[:20]} on "
                                        f"{str(holder.get('host'))[:80]}, renewed {since})")
            try:
                self.s3.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=found["ETag"])
            except Exception:
                raise busy(self.output) from None
        self.etag = self._put(IfNoneMatch="*")
        if self.etag is None:
            raise busy(self.output)

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_SECONDS):
            try:
                etag = self._put(IfMatch=self.etag or "")
            except VaecfError:
                continue  # a transient failure: the lease stays valid for STALE_SECONDS
            if etag is None:
                self.lost = True
                return
            self.etag = etag

    def check(self) -> None:
        """Refuse to publish once another run has taken the lease over."""
        try:
            current = self.s3.head_object(Bucket=self.bucket, Key=self.key)["ETag"]
        except Exception:
            current = None
        if self.lost or current != self.etag:
            raise busy(self.output, " (it took this run's lease over: not renewed for "
                                    f"{STALE_SECONDS:.0f} s)")

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        if not self.lost and self.etag is not None:
            # Taken over meanwhile, or unreachable: STALE_SECONDS frees it.
            with contextlib.suppress(Exception):
                self.s3.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=self.etag)


@contextmanager
def lease(output: str) -> Iterator[Lease]:
    """Hold the lease on the S3 prefix ``output`` for the block."""
    held = Lease(output)
    held.acquire()
    try:
        yield held
    finally:
        held.release()
