"""tritonclient, as shipped, against ``vaecf serve``: one v2 call per mode, answers on stdout.

Run as a script (``python triton_client.py HTTP_URL GRPC_URL``) because tritonclient's gRPC
stubs and KServe's register the same protobuf names (``inference.*``), which one process
cannot hold twice. Input: a JSON list of users (their item ids) on stdin; output: one JSON
object per mode (HTTP binary tensors, HTTP JSON, gRPC), each with its ``item_id``, ``scores``
and ``fallback`` outputs.
"""

from __future__ import annotations

import json
import sys

import numpy as np


def call(module, url: str, items: np.ndarray, binary: bool | None) -> dict:  # type: ignore[no-untyped-def]
    client = module.InferenceServerClient(url)
    inputs = [module.InferInput("items", list(items.shape), "BYTES"),
              module.InferInput("k", [1], "INT32")]
    for tensor, value in zip(inputs, (items, np.array([5], np.int32)), strict=True):
        if binary is None:  # gRPC: raw tensor contents, tritonclient's only way
            tensor.set_data_from_numpy(value)
        else:
            tensor.set_data_from_numpy(value, binary_data=binary)
    result = client.infer("vaecf", inputs)
    answer = {"item_id": [[i.decode() for i in row] for row in result.as_numpy("item_id")],
              "scores": result.as_numpy("scores").tolist(),
              "fallback": result.as_numpy("fallback").tolist(),
              "ready": client.is_model_ready("vaecf")}
    client.close()
    return answer


def main() -> None:
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http

    http_url, grpc_url = sys.argv[1:3]
    users = json.load(sys.stdin)
    width = max(len(u) for u in users)
    items = np.array([u + [""] * (width - len(u)) for u in users], dtype=object)
    print(json.dumps({"http_binary": call(triton_http, http_url, items, True),
                      "http_json": call(triton_http, http_url, items, False),
                      "grpc": call(triton_grpc, grpc_url, items, None)}))


if __name__ == "__main__":
    main()
