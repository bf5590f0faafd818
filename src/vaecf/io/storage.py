"""Object storage: s3:// URIs through boto3, for AWS and for MinIO or SeaweedFS.

The endpoint comes from ``AWS_ENDPOINT_URL`` (boto3 reads it itself); addressing is path-style
and checksums are only computed when required, which non-AWS servers need.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vaecf.errors import VaecfError
from vaecf.io.paths import inside

SUCCESS_MARKER = "_SUCCESS"
MULTIPART_THRESHOLD = 8 * 1024 * 1024


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
    keys: list[str] = []
    try:
        for page in client().get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                       Prefix=prefix):
            keys.extend(obj["Key"][len(prefix):] for obj in page.get("Contents", [])
                        if not (obj["Key"].endswith("/") and obj["Size"] == 0))
    except Exception as err:  # botocore raises several unrelated types
        raise describe(err, uri) from err
    return sorted(keys)


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


def upload_dir(local: Path, uri: str, first: str | None = None) -> None:
    """Publish a directory under an S3 prefix: ``first`` (the manifest), the other objects,
    ``_SUCCESS`` last.

    The order makes every state a killed publish can leave one that the output-location rule
    recognises as this stage's previous output: the old marker goes first (a reader never sees
    a marker beside a half-replaced prefix), then the old objects the new output does not
    have (all listed by the old manifest, which the caller has checked), and only then the
    new manifest, before the objects it lists. Before the new manifest the prefix holds only
    what the old one lists; after it, only what the new one lists.
    """
    files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
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
        upload_file(local / name, f"{uri.rstrip('/')}/{name}")
    bucket, prefix = split_s3(uri)
    marker = f"{prefix}/{SUCCESS_MARKER}" if prefix else SUCCESS_MARKER
    client().put_object(Bucket=bucket, Key=marker, Body=b"")


def download_dir(uri: str, local: Path) -> None:
    """Fetch a published prefix; refuse one without its ``_SUCCESS`` marker."""
    keys = list_keys(uri)
    if SUCCESS_MARKER not in keys:
        raise VaecfError(f"{uri}: no {SUCCESS_MARKER} marker (incomplete or unpublished output)")
    targets = [(name, inside(local, name, uri)) for name in keys if name != SUCCESS_MARKER]
    for name, dest in targets:
        dest.parent.mkdir(parents=True, exist_ok=True)
        download_file(f"{uri.rstrip('/')}/{name}", dest)
