"""Object storage: s3:// URIs through boto3, for AWS and for MinIO or SeaweedFS.

The endpoint comes from ``AWS_ENDPOINT_URL`` (boto3 reads it itself); addressing is path-style
and checksums are only computed when required, which non-AWS servers need.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import IO, Any

from vaecf.errors import VaecfError
from vaecf.io.paths import inside

SUCCESS_MARKER = "_SUCCESS"
MULTIPART_THRESHOLD = 8 * 1024 * 1024
RANGE_BYTES = 8 << 20  # one ranged GET of an object read in place: a block of text, a page


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``."""
    if not is_s3(uri):
        raise VaecfError(f"{uri}: not an s3:// URI")
    bucket, _, key = uri[len("s3://"):].partition("/")
    if len(bucket) < 3:
        raise VaecfError(f"{uri}: bucket name must have at least 3 characters")
    return bucket, key.strip("/")


# What boto3 reads from the environment to reach the store (credentials included).
ENVIRONMENT = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
               "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION")


def environment() -> dict[str, str]:
    """This process's ``ENVIRONMENT`` variables that are set."""
    return {name: os.environ[name] for name in ENVIRONMENT if name in os.environ}


def client() -> Any:
    """A boto3 S3 client configured for AWS and S3-compatible servers."""
    import boto3
    from botocore.config import Config

    config = Config(
        s3={"addressing_style": "path"},
        retries={"max_attempts": 5, "mode": "standard"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None,
                        config=config)


def _transfer_config() -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=MULTIPART_THRESHOLD,
                          multipart_chunksize=MULTIPART_THRESHOLD)


def describe(err: Exception, uri: str) -> VaecfError:
    from botocore.exceptions import ClientError

    if isinstance(err, ClientError):
        code = err.response.get("Error", {}).get("Code", "?")
        return VaecfError(f"{uri}: S3 error {code}")
    return VaecfError(f"{uri}: {err}")


def list_keys(uri: str) -> list[str]:
    """Keys below the prefix ``uri``, relative to it, sorted.

    Folder markers (zero-byte keys ending in ``/``, which S3 consoles create) are no content:
    a prefix holding only ``run1/`` is empty.
    """
    bucket, prefix = split_s3(uri)
    prefix = prefix + "/" if prefix else ""
    return sorted(obj["Key"][len(prefix):] for obj in _objects(uri, bucket, prefix)
                  if not (obj["Key"].endswith("/") and obj["Size"] == 0))


def _objects(uri: str, bucket: str, prefix: str) -> list[dict[str, Any]]:
    """Every object of ``bucket`` whose key starts with ``prefix`` (``uri`` names it in
    errors)."""
    objects: list[dict[str, Any]] = []
    try:
        for page in client().get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                       Prefix=prefix):
            objects.extend(page.get("Contents", []))
    except Exception as err:  # botocore raises several unrelated types
        raise describe(err, uri) from err
    return objects


def keys_starting(uri: str) -> list[str]:
    """The keys that start with ``uri``'s key, as they are (``s3://b/p/.x`` lists
    ``p/.x-1/a``, not ``p/.x/...`` alone), sorted."""
    bucket, start = split_s3(uri)
    return sorted(obj["Key"] for obj in _objects(uri, bucket, start))


def list_names(uri: str) -> list[str]:
    """The names of the objects directly below the prefix ``uri`` (not below its folders)."""
    bucket, prefix = split_s3(uri)
    prefix = prefix + "/" if prefix else ""
    names: list[str] = []
    try:
        for page in client().get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix, Delimiter="/"):
            names.extend(obj["Key"][len(prefix):] for obj in page.get("Contents", []))
    except Exception as err:  # botocore raises several unrelated types
        raise describe(err, uri) from err
    return sorted(names)


def download_file(uri: str, dest: Path) -> None:
    """Download one object to ``dest``."""
    bucket, key = split_s3(uri)
    try:
        client().download_file(bucket, key, str(dest), Config=_transfer_config())
    except OSError as err:  # a full disk or quota where the copy goes (often $TMPDIR)
        raise VaecfError(f"{uri}: {err.strerror or err} while downloading to {dest.parent}"
                         ) from err
    except Exception as err:
        raise describe(err, uri) from err


def read_object(uri: str, limit: int) -> bytes:
    """The bytes of one object, at most ``limit`` (a larger object is refused in one line);
    read into memory, so nothing is left in ``$TMPDIR`` if the process is killed."""
    bucket, key = split_s3(uri)
    try:
        body = client().get_object(Bucket=bucket, Key=key)["Body"]
        data: bytes = body.read(limit + 1)
        body.close()
    except Exception as err:
        raise describe(err, uri) from err
    if len(data) > limit:
        raise VaecfError(f"{uri}: larger than {limit:,} bytes; not read")
    return data


def upload_file(src: Path, uri: str) -> None:
    """Upload one file (multipart above 8 MiB)."""
    bucket, key = split_s3(uri)
    try:
        client().upload_file(str(src), bucket, key, Config=_transfer_config())
    except Exception as err:
        raise describe(err, uri) from err


def delete_keys(uri: str, keys: list[str]) -> None:
    bucket, prefix = split_s3(uri)
    s3 = client()
    for start in range(0, len(keys), 1000):
        batch = [{"Key": f"{prefix}/{k}" if prefix else k} for k in keys[start:start + 1000]]
        s3.delete_objects(Bucket=bucket, Delete={"Objects": batch})


def check_bucket(uri: str) -> None:
    """Fail early, before any work, if the bucket cannot be reached."""
    bucket, _ = split_s3(uri)
    try:
        client().head_bucket(Bucket=bucket)
    except Exception as err:
        raise describe(err, uri) from err


def upload_dir(local: Path, uri: str, first: str | None = None,
               remote: str | None = None) -> None:
    """Publish a directory under an S3 prefix: ``first`` (the manifest), the other objects,
    ``_SUCCESS`` last. ``remote``: a staging prefix whose objects (the parts a cluster's
    tasks wrote) are published too, copied inside the store.

    The order makes every state a killed publish can leave one that the output-location rule
    recognises as this stage's previous output: the old marker goes first (a reader never sees
    a marker beside a half-replaced prefix), then the old objects the new output does not
    have (all listed by the old manifest, which the caller has checked), and only then the
    new manifest, before the objects it lists. Before the new manifest the prefix holds only
    what the old one lists; after it, only what the new one lists.
    """
    sources = {p.relative_to(local).as_posix(): str(p) for p in local.rglob("*") if p.is_file()}
    if remote is not None:
        sources.update({name: f"{remote.rstrip('/')}/{name}" for name in list_keys(remote)})
    files = sorted(sources)
    if first in files:
        files.remove(first)
        files.insert(0, first)
    existing = set(list_keys(uri))
    if SUCCESS_MARKER in existing:
        delete_keys(uri, [SUCCESS_MARKER])
    stale = sorted(existing - set(files) - {SUCCESS_MARKER})
    if stale:
        delete_keys(uri, stale)
    for name in files:
        target = f"{uri.rstrip('/')}/{name}"
        if is_s3(sources[name]):
            copy_object(sources[name], target)
        else:
            upload_file(Path(sources[name]), target)
    bucket, prefix = split_s3(uri)
    marker = f"{prefix}/{SUCCESS_MARKER}" if prefix else SUCCESS_MARKER
    client().put_object(Bucket=bucket, Key=marker, Body=b"")


def delete_prefix(uri: str) -> None:
    """Remove every object below the prefix ``uri`` (a staging prefix this process made)."""
    keys = list_keys(uri)
    if keys:
        delete_keys(uri, keys)


def download_dir(uri: str, local: Path) -> None:
    """Fetch a published prefix; refuse one without its ``_SUCCESS`` marker."""
    keys = list_keys(uri)
    if SUCCESS_MARKER not in keys:
        raise VaecfError(f"{uri}: no {SUCCESS_MARKER} marker (incomplete or unpublished output)")
    targets = [(name, inside(local, name, uri)) for name in keys if name != SUCCESS_MARKER]
    for name, dest in targets:
        dest.parent.mkdir(parents=True, exist_ok=True)
        download_file(f"{uri.rstrip('/')}/{name}", dest)


class _Ranges(io.RawIOBase):
    """One object, read in place by ranged GETs: what a task of the Spark engine opens
    instead of a local copy (seekable, so pyarrow reads a Parquet footer and row groups)."""

    def __init__(self, uri: str) -> None:
        super().__init__()
        self.uri = uri
        self._bucket, self._key = split_s3(uri)
        self._client = client()
        self._size = object_size(uri, self._client)
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        wanted = min(len(view), self._size - self._position)
        if wanted <= 0:
            return 0
        last = self._position + wanted - 1
        try:
            body = self._client.get_object(Bucket=self._bucket, Key=self._key,
                                           Range=f"bytes={self._position}-{last}")["Body"]
            data = body.read()
            body.close()
        except Exception as err:  # botocore raises several unrelated types
            raise describe(err, self.uri) from err
        view[:len(data)] = data
        self._position += len(data)
        return len(data)


def object_size(uri: str, s3: Any = None) -> int:
    """The bytes of one object (a HEAD request)."""
    bucket, key = split_s3(uri)
    try:
        return int((s3 or client()).head_object(Bucket=bucket, Key=key)["ContentLength"])
    except Exception as err:
        raise describe(err, uri) from err


def open_source(path: str | Path) -> IO[bytes]:
    """A data file opened for reading: a local path, or an ``s3://`` object read in place
    by ranged GETs of ``RANGE_BYTES`` (nothing is copied to a local disk)."""
    if isinstance(path, str) and is_s3(path):
        return io.BufferedReader(_Ranges(path), RANGE_BYTES)
    return open(path, "rb")


def source_size(path: str | Path) -> int:
    """The bytes of a local file or an ``s3://`` object."""
    if isinstance(path, str) and is_s3(path):
        return object_size(path)
    return os.stat(path).st_size


def copy_object(source: str, dest: str) -> None:
    """Copy one object inside the object store (server-side: no byte passes through here;
    multipart above 8 MiB)."""
    bucket, key = split_s3(source)
    to_bucket, to_key = split_s3(dest)
    try:
        client().copy({"Bucket": bucket, "Key": key}, to_bucket, to_key,
                      Config=_transfer_config())
    except Exception as err:
        raise describe(err, source) from err
