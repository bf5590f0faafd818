"""Local paths and s3:// URIs, atomic publish, manifests with checksums."""

from vaecf.io.location import check_output
from vaecf.io.manifest import manifest_name, read_manifest, sha256_file, write_manifest
from vaecf.io.publish import open_input, open_input_file, publish, read_jsonl, scratch
from vaecf.io.storage import is_s3

__all__ = ["check_output", "is_s3", "manifest_name", "open_input", "open_input_file", "publish",
           "read_jsonl", "read_manifest", "scratch", "sha256_file", "write_manifest"]
