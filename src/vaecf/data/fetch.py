"""Fetch one file from https://, http://, s3:// or a local path, robustly.

HTTP downloads retry transient failures (connection errors, timeouts, 5xx, 429) with
exponential backoff and resume a partial file with an HTTP ``Range`` request, so a dropped
connection two gigabytes into a Netflix archive costs seconds, not the whole transfer.
Errors a retry cannot fix (404, 403, a missing local file, a host name that does not
resolve, as on a machine without network) stop at once with one line.
"""

from __future__ import annotations

import http.client
import shutil
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from vaecf import log
from vaecf.errors import VaecfError
from vaecf.io import storage

_TRANSIENT_HTTP = {408, 425, 429, 500, 502, 503, 504}
_BLOCK = 1 << 20


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: ``attempts`` tries, sleeping ``backoff_seconds * 2**k`` after try k."""

    attempts: int = 6
    backoff_seconds: float = 1.0
    timeout_seconds: float = 60.0


DEFAULT_RETRY = RetryPolicy()


class _Transient(Exception):
    """A failure worth retrying (the partial file is kept and resumed)."""


def source_name(uri: str) -> str:
    """The file name a source URI publishes under (its last path component)."""
    name = Path(urlparse(uri).path if "://" in uri else uri).name
    if not name:
        raise VaecfError(f"{uri}: source has no file name")
    return name


def fetch(uri: str, dest: Path, policy: RetryPolicy = DEFAULT_RETRY) -> None:
    """Copy the file at ``uri`` to ``dest`` (https/http, s3:// object, file:// or path)."""
    scheme = urlparse(uri).scheme
    if scheme in ("http", "https"):
        _fetch_http(uri, dest, policy)
    elif storage.is_s3(uri):
        log.info(f"download {uri}")
        storage.download_file(uri, dest)
    elif scheme in ("", "file"):
        _copy_local(Path(uri.removeprefix("file://")), dest)
    else:
        raise VaecfError(f"{uri}: unsupported source scheme '{scheme}' "
                         "(expected https://, http://, s3://, file:// or a path)")


def _copy_local(path: Path, dest: Path) -> None:
    if not path.is_file():
        raise VaecfError(f"{path}: source file does not exist")
    log.info(f"copy {path}")
    try:
        shutil.copyfile(path, dest)
    except OSError as err:
        raise VaecfError(f"{path}: cannot copy ({err.strerror})") from err


def _fetch_http(url: str, dest: Path, policy: RetryPolicy) -> None:
    dest.unlink(missing_ok=True)
    for attempt in range(1, policy.attempts + 1):
        try:
            _http_attempt(url, dest, policy.timeout_seconds)
            return
        except _Transient as err:
            if attempt == policy.attempts:
                raise VaecfError(f"{url}: download failed after {attempt} attempts "
                                 f"({err})") from None
            delay = policy.backoff_seconds * 2 ** (attempt - 1)
            log.info(f"{url}: {err}; retrying in {delay:.1f}s "
                     f"(attempt {attempt + 1}/{policy.attempts})")
            time.sleep(delay)


def _open(url: str, have: int, timeout: float) -> http.client.HTTPResponse | None:
    """Open ``url`` from byte ``have``; ``None`` means the server says nothing is left."""
    headers = {"Range": f"bytes={have}-"} if have else {}
    try:
        response: http.client.HTTPResponse = urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=timeout)
        return response
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:
            return None
        if err.code in _TRANSIENT_HTTP:
            raise _Transient(f"HTTP {err.code} {err.reason}") from None
        raise VaecfError(f"{url}: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, socket.gaierror):
            raise VaecfError(f"{url}: cannot resolve host '{urlparse(url).hostname}' "
                             f"({reason.strerror}): no network, or a wrong name") from None
        raise _Transient(f"cannot connect ({reason})") from None


def _http_attempt(url: str, dest: Path, timeout: float) -> None:
    have = dest.stat().st_size if dest.exists() else 0
    response = _open(url, have, timeout)
    if response is None:
        return
    with response:
        resumed = response.status == 206
        if resumed and not response.headers.get("Content-Range", "").startswith(
                f"bytes {have}-"):
            dest.unlink()  # a range we did not ask for: start over from byte 0
            raise _Transient("server answered with another byte range")
        start = have if resumed else 0
        length = response.headers.get("Content-Length")
        total = start + int(length) if length and length.isdigit() else None
        if resumed:
            log.info(f"{url}: resuming at byte {start:,}")
        bar = log.Progress(f"download {source_name(url)}", total, "bytes")
        bar.update(start)
        with open(dest, "ab" if resumed else "wb") as out:
            _copy_body(response, out, bar)
        bar.close()
    size = dest.stat().st_size
    if total is not None and size < total:
        raise _Transient(f"connection closed after {size:,} of {total:,} bytes")


def _copy_body(response: http.client.HTTPResponse, out: object, bar: log.Progress) -> None:
    write = out.write  # type: ignore[attr-defined]
    while True:
        try:
            block = response.read(_BLOCK)
        except (http.client.HTTPException, OSError) as err:
            raise _Transient(f"connection lost ({type(err).__name__})") from None
        if not block:
            return
        write(block)
        bar.update(len(block))
