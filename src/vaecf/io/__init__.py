"""Local paths and s3:// URIs, atomic publish, manifests with checksums."""

from vaecf.io.manifest import read_manifest, sha256_file, write_manifest
from vaecf.io.publish import open_input, open_input_file, publish
from vaecf.io.storage import is_s3

__all__ = ["is_s3", "open_input", "open_input_file", "publish", "read_manifest", "sha256_file",
           "write_manifest"]
