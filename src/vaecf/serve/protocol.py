"""Requests in, rankings out: v1 (KServe and TF Serving JSON) and v2 (Open Inference Protocol).

A request names B users by their items (raw ids, as text) and how many items each wants:

- v1 rows: ``{"instances": [{"items": ["1", "50"], "k": 20}, ...]}`` (``k`` optional, 20),
  answered ``{"predictions": [{"item_id": [...], "scores": [...], "unknown": 0,
  "fallback": false}, ...]}``;
- v1 columns, TF Serving's form: ``{"inputs": {"items": [["1", "50"], ...], "k": [20, ...]}}``
  (rows right-padded with ""), answered ``{"outputs": {"item_id": [[...]], ...}}``;
- v2: ``items`` BYTES [B, L] ("" pads) and ``k`` INT32 [B] or [1], answered ``item_id``
  BYTES [B, K], ``scores`` FP32 [B, K], ``unknown`` INT32 [B], ``fallback`` BOOL [B].

Whatever is wrong in a request raises ``InvalidInput`` (HTTP 400) with one line naming the
field, or ``RequestTooLarge`` (413) past the limits below; nothing a client sends reaches the
model unchecked.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from kserve.errors import InvalidInput
from kserve.protocol.infer_type import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    RequestedOutput,
)

from vaecf.io.readers import MAX_ID_BYTES  # one id limit: the data stages refuse longer ids
from vaecf.serve.model import Ranking

DEFAULT_K = 20
MAX_K = 1000
MAX_USERS = 1024  # per request
MAX_ITEMS = 10_000  # per user; ML-20M's most active user has 9,254 ratings
MAX_BODY_BYTES = 8 * 2**20  # checked from Content-Length before the body is read
INPUTS = [{"name": "items", "datatype": "BYTES", "shape": [-1, -1]},
          {"name": "k", "datatype": "INT32", "shape": [-1]}]
OUTPUTS = [{"name": "item_id", "datatype": "BYTES", "shape": [-1, -1]},
           {"name": "scores", "datatype": "FP32", "shape": [-1, -1]},
           {"name": "unknown", "datatype": "INT32", "shape": [-1]},
           {"name": "fallback", "datatype": "BOOL", "shape": [-1]}]


def max_answer_bytes(n_items: int, id_bytes: int) -> int:
    """The most bytes a v2 answer within the limits can take as a gRPC message.

    ``MAX_USERS`` users x ``min(MAX_K, n_items)`` places, each an id of at most ``id_bytes``
    (the model's longest) with at most 4 bytes of framing (a raw tensor's length prefix, or a
    field tag and length) and a 4-byte score; per user an ``unknown`` count and a
    ``fallback`` flag (at most 6 bytes); the request's own id, echoed back (at most the whole
    request, ``MAX_BODY_BYTES``); 4 KiB for names, shapes and message framing.
    """
    places = MAX_USERS * min(MAX_K, n_items)
    return places * (id_bytes + 8) + MAX_USERS * 6 + MAX_BODY_BYTES + 4096


class RequestTooLarge(InvalidInput):
    """A request past a documented limit (HTTP 413)."""


@dataclass(frozen=True)
class Batch:
    """B users of one request: their items and their k.

    ``users[i]`` is bytes (n_i,): user i's raw ids as UTF-8, "" padding dropped. One array
    per user, not a list of Python strings: a request's million ids are freed as soon as it
    is parsed, before any model call, so they cannot leave the heap fragmented.
    """

    users: list[np.ndarray]
    k: list[int]
    columns: bool = False  # v1: answer in TF Serving's columnar form


def _ids(value: Any, where: str) -> np.ndarray:
    if not isinstance(value, list):
        raise InvalidInput(f"{where}: expected a list of item ids (strings)")
    if len(value) > MAX_ITEMS:
        raise RequestTooLarge(f"{where}: {len(value):,} items, over the limit of {MAX_ITEMS:,} "
                              "per user")
    for position, item in enumerate(value):
        if not isinstance(item, str):
            raise InvalidInput(f"{where}[{position}]: expected an item id as a string, got "
                               f"{_short(item)}")
    return _packed([_utf8(item, f"{where}[{i}]") for i, item in enumerate(value)])


def _utf8(value: Any, where: str) -> bytes:
    """An item id as UTF-8 bytes, at most ``MAX_ID_BYTES``."""
    try:
        if isinstance(value, bytes):
            value.decode()
            encoded = value
        elif isinstance(value, str):
            encoded = value.encode()
        else:
            raise InvalidInput(f"{where}: expected item ids as strings, got {_short(value)}")
    except UnicodeError:
        raise InvalidInput(f"{where}: an item id that is not UTF-8 text") from None
    if len(encoded) > MAX_ID_BYTES:
        raise RequestTooLarge(f"{where}: an item id of {len(encoded):,} bytes, over the limit "
                              f"of {MAX_ID_BYTES}")
    return encoded


def _packed(ids: list[bytes]) -> np.ndarray:
    return np.array([i for i in ids if i], dtype=np.bytes_)


def _k(value: Any, where: str, n_items: int) -> int:
    top = min(MAX_K, n_items)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        raise InvalidInput(f"{where}: expected an integer from 1 to {top}, got {_short(value)}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _users(count: int, where: str) -> None:
    if count == 0:
        raise InvalidInput(f"{where}: no users")
    if count > MAX_USERS:
        raise RequestTooLarge(f"{where}: {count:,} users, over the limit of {MAX_USERS:,} per "
                              "request")


def parse_v1(body: Any, n_items: int) -> Batch:
    """A v1 body (the request's bytes, or JSON KServe decoded) -> a ``Batch``; rows or TF
    Serving columns.

    ``vaecf.serve.gate`` hands every v1 body to KServe as ``application/json;
    charset=utf-8``, which KServe passes on undecoded: malformed JSON gets this module's
    message, whatever content type the client sent (or none).
    """
    if isinstance(body, bytes):
        try:
            body = orjson.loads(body)
        except orjson.JSONDecodeError as err:
            raise InvalidInput(f"request body: malformed JSON ({err})") from None
    if not isinstance(body, dict) or len(body.keys() & {"instances", "inputs"}) != 1:
        raise InvalidInput("request body: expected a JSON object with either 'instances' "
                           "(one object per user) or 'inputs' (TF Serving columns)")
    if "inputs" in body:
        return _columns(body["inputs"], n_items)
    rows = body["instances"]
    if not isinstance(rows, list):
        raise InvalidInput("instances: expected a list of users")
    _users(len(rows), "instances")
    users, k = [], []
    for row, user in enumerate(rows):
        where = f"instances[{row}]"
        if not isinstance(user, dict) or "items" not in user or user.keys() - {"items", "k"}:
            raise InvalidInput(f'{where}: expected {{"items": [ids...], "k": K}}, got '
                               f"{_short(user)}")
        users.append(_ids(user["items"], f"{where}.items"))
        k.append(_k(user.get("k", DEFAULT_K), f"{where}.k", n_items))
    return Batch(users, k)


def _columns(inputs: Any, n_items: int) -> Batch:
    if not isinstance(inputs, dict) or inputs.keys() != {"items", "k"}:
        raise InvalidInput('inputs: expected {"items": [[ids...], ...], "k": [K, ...]}')
    rows = inputs["items"]
    if not isinstance(rows, list):
        raise InvalidInput("inputs.items: expected a list of users' item lists")
    _users(len(rows), "inputs.items")
    users = [_ids(items, f"inputs.items[{row}]") for row, items in enumerate(rows)]
    k = inputs["k"]
    ks = k if isinstance(k, list) else [k]
    if len(ks) not in (1, len(users)):
        raise InvalidInput(f"inputs.k: expected 1 or {len(users)} values, got {len(ks)}")
    ks = [_k(value, f"inputs.k[{i}]", n_items) for i, value in enumerate(ks)]
    return Batch(users, ks * len(users) if len(ks) == 1 else ks, columns=True)


def parse_v2(request: InferRequest, n_items: int) -> Batch:
    """A v2 ``InferRequest`` (REST JSON, REST binary tensors, gRPC contents or raw) -> a
    ``Batch``.

    Both tensors go through ``_tensor``, the one parse-and-check of every protocol, and the
    limits are read from the data as parsed. ``k`` is checked value by value as v1 checks it
    (an integer, not a bool, a float or a string, from 1 to the cap), before any cast to
    INT32 could wrap or truncate it.
    """
    by_name = {i.name: i for i in request.inputs}
    if by_name.keys() != {"items", "k"}:
        raise InvalidInput(f"inputs: expected 'items' (BYTES [B, L]) and 'k' (INT32 [B]), got "
                           f"{sorted(by_name) or 'none'}")
    ids = _tensor(by_name["items"], ("BYTES",), 2, "BYTES of shape [B, L]")
    ks = _tensor(by_name["k"], ("INT32", "INT64"), 1, "INT32 of shape [B] or [1]").tolist()
    _users(ids.shape[0], "items")
    if ids.shape[1] > MAX_ITEMS:
        raise RequestTooLarge(f"items: {ids.shape[1]:,} per user, over the limit of "
                              f"{MAX_ITEMS:,}")
    users = [_packed([_utf8(i, f"items[{row}]") for i in row_ids])
             for row, row_ids in enumerate(ids)]
    if len(ks) not in (1, len(users)):
        raise InvalidInput(f"k: expected 1 or {len(users)} values, got {len(ks)}")
    kk = [_k(value, f"k[{i}]", n_items) for i, value in enumerate(ks)]
    return Batch(users, kk * len(users) if len(kk) == 1 else kk)


def read_v2_binary(body: bytes, header_bytes: int, model_name: str) -> InferRequest:
    """A v2 REST body with binary tensors (the JSON header of ``header_bytes``, then each
    binary input's bytes in order) -> an ``InferRequest`` whose binary inputs keep their
    bytes undecoded, as gRPC's raw contents are: ``_tensor`` then reads both the one way.

    (KServe's own reader decodes each input into its declared shape and Python strings
    before the model sees it, so a bad shape got KServe's message, not this module's.)
    """
    try:
        header = orjson.loads(body[:header_bytes])
    except orjson.JSONDecodeError as err:
        raise InvalidInput(f"request body: malformed JSON header ({err})") from None
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise InvalidInput("request body: expected a JSON header with a list of 'inputs'")
    inputs, offset = [], header_bytes
    for position, spec in enumerate(header["inputs"]):
        where = f"inputs[{position}]"
        if not (isinstance(spec, dict) and isinstance(spec.get("name"), str)
                and isinstance(spec.get("datatype"), str) and isinstance(spec.get("shape"), list)):
            raise InvalidInput(f"{where}: expected an object with 'name', 'datatype' and "
                               "'shape'")
        parameters = _object(spec.get("parameters")) or {}
        tensor = InferInput(spec["name"], spec["shape"], spec["datatype"], spec.get("data"),
                            parameters)
        if "data" not in spec:
            size = parameters.get("binary_data_size")
            if type(size) is not int or not 0 <= size <= len(body) - offset:
                raise InvalidInput(f"{where}: expected 'data' or parameters.binary_data_size "
                                   f"of at most the {len(body) - offset:,} bytes left, got "
                                   f"{_short(size)}")
            tensor._raw_data = body[offset:offset + size]  # KServe's own reader's attribute
            offset += size
        inputs.append(tensor)
    outputs = header.get("outputs")
    requested = ([RequestedOutput(o["name"], _object(o.get("parameters"))) for o in outputs
                  if isinstance(o, dict) and isinstance(o.get("name"), str)]
                 if isinstance(outputs, list) else None)
    request_id = header.get("id")
    return InferRequest(model_name=model_name, infer_inputs=inputs,
                        request_id=request_id if isinstance(request_id, str) else None,
                        parameters=_object(header.get("parameters")),
                        request_outputs=requested or None)


def _object(value: Any) -> dict[str, Any] | None:
    """A JSON object of parameters, or None for anything else (never a list to ``.get``)."""
    return value if isinstance(value, dict) else None


def _tensor(tensor: InferInput, datatypes: tuple[str, ...], rank: int, expected: str
            ) -> np.ndarray:
    """One v2 input as sent, of its declared shape, or ``InvalidInput`` naming it.

    Its datatype is one of ``datatypes``; its shape has ``rank`` sizes, each an integer >= 0
    (``-1`` marks a free size in the model's metadata, never in a request); its data fills
    exactly that shape: flat, or nested by rows as declared. JSON values and gRPC
    contents stay the Python values the client sent (object array, each checked later, never
    cast); raw bytes (gRPC ``raw_input_contents``, REST binary tensors) are decoded by
    KServe's reader and reshaped, which refuses a count that does not fill the shape.
    """
    name, shape = tensor.name, list(tensor.shape)
    if tensor.datatype not in datatypes or len(shape) != rank:
        raise InvalidInput(f"{name}: expected {expected}, got {tensor.datatype} {shape}")
    if not all(type(size) is int and size >= 0 for size in shape):
        raise InvalidInput(f"{name}: shape {shape}: expected every size an integer >= 0 (-1 "
                           "marks a free size in the model's metadata, not in a request)")
    try:
        values = (np.array(tensor.data, dtype=object) if tensor.data
                  else np.asarray(tensor.as_numpy()))
    except (ValueError, TypeError, struct.error) as err:
        raise InvalidInput(f"{name}: data does not match the declared shape {shape} "
                           f"({err})") from None
    if values.shape != tuple(shape) and not (values.ndim == 1
                                             and values.size == math.prod(shape)):
        raise InvalidInput(f"{name}: data does not match the declared shape {shape} (got "
                           f"{values.size:,} values, as {list(values.shape)})")
    return values.reshape(shape)


def v1_response(ranking: Ranking, batch: Batch) -> dict[str, Any]:
    """Per user its top-k ids and scores (no padding), unknown ids and the fallback mark.

    The scores stay float32 arrays, which KServe's JSON writer (orjson, numpy enabled) writes
    as float32 numbers without a Python float per place.
    """
    rows = []
    for user, k in enumerate(batch.k):
        found = int(np.count_nonzero(ranking.item_ids[user, :k] != ""))
        rows.append({"item_id": ranking.item_ids[user, :found].tolist(),
                     "scores": ranking.scores[user, :found],  # float32, written by orjson
                     "unknown": int(ranking.unknown[user]),
                     "fallback": bool(ranking.fallback[user])})
    if not batch.columns:
        return {"predictions": rows}
    return {"outputs": {name: [row[name] for row in rows] for name in rows[0]}}


def v2_response(ranking: Ranking, request: InferRequest, model_name: str) -> InferResponse:
    """The four outputs as tensors; past a user's k, id "" and score 0 (JSON has no -inf).

    Binary or JSON as the request asks (KServe's own servers do the same): REST
    ``binary_data_output`` or per-output ``binary_data`` (the binary tensor extension, which
    tritonclient asks for by default), gRPC raw outputs for raw inputs.
    """
    scores = np.where(ranking.item_ids == "", np.float32(0), ranking.scores).astype(np.float32)
    binary = bool(request.use_binary_outputs)
    outputs = []
    for spec, value in zip(OUTPUTS, (ranking.item_ids, scores, ranking.unknown.astype(np.int32),
                                     ranking.fallback.astype(bool)), strict=True):
        output = InferOutput(name=spec["name"], shape=list(value.shape),
                             datatype=spec["datatype"])
        output.set_data_from_numpy(value, binary_data=binary)
        outputs.append(output)
    return InferResponse(response_id=request.id or "", model_name=model_name,
                         infer_outputs=outputs, use_binary_outputs=binary,
                         requested_outputs=request.request_outputs)
