"""``vaecf serve`` as a real server process on loopback, with real HTTP and gRPC clients:
v1 rows and TF Serving columns, v2 REST and gRPC, every bad request, concurrent clients, and
SIGTERM draining in-flight requests."""

from __future__ import annotations

import http.client
import itertools
import json
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc
from kserve.protocol.infer_type import deserialize_bytes_tensor

from vaecf.serve.loadtest import ServerProcess, request, v1_body
from vaecf.serve.model import ServedModel

JSON = {"Content-Type": "application/json"}
V1 = "/v1/models/vaecf:predict"
V2 = "/v2/models/vaecf/infer"


@pytest.fixture(scope="module")
def model(small_model: Path) -> Path:
    return small_model


@pytest.fixture(scope="module")
def expected(model: Path) -> ServedModel:
    """The same signature, loaded in the test process: what every endpoint must answer."""
    return ServedModel.load(str(model))


@pytest.fixture(scope="module")
def server(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(str(model))
    process.start(tmp_path_factory.mktemp("serve-log") / "serve.log")
    yield process
    assert process.stop() == 0, process.log_tail()


def post(server: ServerProcess, path: str, body: Any) -> tuple[int, Any]:
    status, raw = request(server.url, "POST", path, json.dumps(body).encode(), JSON)
    return status, json.loads(raw)


def users_of(expected: ServedModel) -> list[list[str]]:
    ids = expected.item_ids.tolist()
    return [ids[:5], [ids[7], "no-such-item", ids[7]], ["no-such-item"], []]


def test_v1_rows_and_tf_serving_columns_give_the_model_s_ranking(server, expected) -> None:
    users = users_of(expected)
    truth = expected.recommend(users, [10] * len(users))
    status, rows = post(server, V1, {"instances": [{"items": u, "k": 10} for u in users]})
    assert status == 200, rows
    status, raw = request(server.url, "POST", V1, json.dumps({"inputs": {
        "items": [u + [""] * (5 - len(u)) for u in users], "k": [10] * 4}}).encode(),
        {"Content-Type": "application/json; charset=utf-8"})
    assert status == 200, raw
    columns = json.loads(raw)
    for user, answer in enumerate(rows["predictions"]):
        assert answer["item_id"] == truth.item_ids[user].tolist()
        np.testing.assert_allclose(answer["scores"], truth.scores[user], rtol=1e-5)
        assert not set(answer["item_id"]) & set(users[user])
        for name in ("item_id", "unknown", "fallback"):
            assert columns["outputs"][name][user] == answer[name]
    assert [r["unknown"] for r in rows["predictions"]] == [0, 1, 1, 0]
    assert [r["fallback"] for r in rows["predictions"]] == [False, False, True, True]
    popular = rows["predictions"][3]
    # the popularity fallback scores: training users per item, whole positive counts
    assert all(score >= 1 and float(score).is_integer() for score in popular["scores"])


def test_v2_rest_and_grpc_answer_typed_tensors(server, expected) -> None:
    users = users_of(expected)[:3]
    truth = expected.recommend(users, [5] * 3)
    flat = [i for u in users for i in u + [""] * (5 - len(u))]
    status, answer = post(server, V2, {"inputs": [
        {"name": "items", "datatype": "BYTES", "shape": [3, 5], "data": flat},
        {"name": "k", "datatype": "INT32", "shape": [1], "data": [5]}]})
    assert status == 200, answer
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert outputs["item_id"]["shape"] == [3, 5]
    assert outputs["item_id"]["data"] == truth.item_ids.ravel().tolist()
    assert outputs["unknown"]["data"] == [0, 1, 1]
    assert outputs["fallback"]["data"] == [False, False, True]

    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        metadata = stub.ModelMetadata(pb.ModelMetadataRequest(name="vaecf"))
        assert [(t.name, t.datatype) for t in metadata.inputs] == [("items", "BYTES"),
                                                                   ("k", "INT32")]
        reply = stub.ModelInfer(pb.ModelInferRequest(model_name="vaecf", inputs=[
            pb.ModelInferRequest.InferInputTensor(
                name="items", datatype="BYTES", shape=[3, 5],
                contents=pb.InferTensorContents(bytes_contents=[i.encode() for i in flat])),
            pb.ModelInferRequest.InferInputTensor(
                name="k", datatype="INT32", shape=[1],
                contents=pb.InferTensorContents(int_contents=[5]))]))
        by_name = {o.name: o for o in reply.outputs}
        assert [b.decode() for b in by_name["item_id"].contents.bytes_contents] == \
            truth.item_ids.ravel().tolist()
        assert list(by_name["fallback"].contents.bool_contents) == [False, False, True]
        with pytest.raises(grpc.RpcError) as bad:
            stub.ModelInfer(pb.ModelInferRequest(model_name="vaecf", inputs=[]))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad.value.details().startswith("inputs: expected 'items' (BYTES [B, L])")


def test_health_readiness_metadata_and_metrics(server) -> None:
    assert request(server.url, "GET", "/")[0] == 200
    status, ready = request(server.url, "GET", "/v1/models/vaecf")
    assert status == 200 and json.loads(ready) == {"name": "vaecf", "ready": True}
    status, metadata = request(server.url, "GET", "/v2/models/vaecf")
    assert status == 200
    assert json.loads(metadata)["outputs"][3] == {"name": "fallback", "datatype": "BOOL",
                                                  "shape": [-1]}
    status, metrics = request(server.url, "GET", "/metrics")
    assert status == 200 and b"request_predict_seconds" in metrics


def v2_items(datatype: str, shape: list[int], data: list[Any]) -> dict[str, Any]:
    return {"inputs": [{"name": "items", "datatype": datatype, "shape": shape, "data": data},
                       {"name": "k", "datatype": "INT32", "shape": [1], "data": [5]}]}


PAST_THE_BODY = (b'{"inputs": [{"name": "items", "datatype": "BYTES", "shape": [1, 1], '
                 b'"parameters": {"binary_data_size": 99}}, {"name": "k", "datatype": "INT32", '
                 b'"shape": [1], "data": [5]}]}')
BAD = [  # path, body, headers, status, message (start of it)
    (V2, PAST_THE_BODY + b"\x01\x00\x00\x00a",
     {"Inference-Header-Content-Length": str(len(PAST_THE_BODY))}, 400,
     "inputs[0]: expected 'data' or parameters.binary_data_size of at most the 5 bytes left, "
     "got 99"),
    (V1, b'{"instances": [', JSON, 400, "request body: malformed JSON"),
    (V1, b'{"instances": [', {}, 400, "request body: malformed JSON"),
    (V2, b'{"inputs": [', JSON, 400, "request body: malformed JSON"),
    (V2, b'{"inputs": [', {}, 400, "request body: malformed JSON"),
    (V2, b'\xff\xfe{}', JSON, 400, "request body: malformed JSON"),
    (V2, b'{"inputs": []}', {"Inference-Header-Content-Length": "x"}, 400,
     "inference-header-content-length: expected the JSON header's length"),
    (V2, b'{"inputs": []}', {"Inference-Header-Content-Length": "99"}, 400,
     "inference-header-content-length: expected the JSON header's length"),
    (V2, b'{"inputs": [{"name": "items"}]}', {"Inference-Header-Content-Length": "31"}, 400,
     "inputs[0]: expected an object with 'name', 'datatype' and 'shape'"),
    (V2, b'{"inputs": [{"name": "items", "datatype": "BYTES", "shape": [1, 1], "parameters": '
         b'{"binary_data_size": 5}}, {"name": "k", "datatype": "INT32", "shape": [1], '
         b'"data": [5]}]}\x09\x00\x00\x00a',
     {"Inference-Header-Content-Length": "171"}, 400,
     "items: data does not match the declared shape [1, 1] (unpack_from requires"),
    (V1, b'{"users": []}', JSON, 400, "request body: expected a JSON object with either"),
    (V1, b'[1, 2]', JSON, 400, "request body: expected a JSON object with either"),
    (V1, b'{"instances": {"items": []}}', JSON, 400, "instances: expected a list of users"),
    (V1, b'{"instances": []}', JSON, 400, "instances: no users"),
    (V1, b'{"instances": [{"items": [1, 2]}]}', JSON, 400,
     "instances[0].items[0]: expected an item id as a string, got 1"),
    (V1, b'{"instances": [{"items": "1"}]}', JSON, 400,
     "instances[0].items: expected a list of item ids"),
    (V1, b'{"instances": [{"items": ["1"], "top": 3}]}', JSON, 400, "instances[0]: expected"),
    (V1, b'{"instances": [{"items": ["1"], "k": 0}]}', JSON, 400,
     "instances[0].k: expected an integer from 1 to 300, got 0"),
    (V1, b'{"instances": [{"items": ["1"], "k": 301}]}', JSON, 400,
     "instances[0].k: expected an integer from 1 to 300, got 301"),
    (V1, b'{"instances": [{"items": ["1"], "k": true}]}', JSON, 400,
     "instances[0].k: expected an integer"),
    (V1, b'{"instances": [{"items": ["1"], "k": "5"}]}', JSON, 400,
     "instances[0].k: expected an integer"),
    (V1, b'{"inputs": {"items": [["1"]], "k": [5, 5]}}', JSON, 400,
     "inputs.k: expected 1 or 1 values, got 2"),
    (V1, json.dumps({"instances": [{"items": []}] * 1025}).encode(), JSON, 413,
     "instances: 1,025 users, over the limit of 1,024 per request"),
    (V1, json.dumps({"instances": [{"items": ["1"] * 10001}]}).encode(), JSON, 413,
     "instances[0].items: 10,001 items, over the limit of 10,000 per user"),
    (V1, b'{"instances": [{"items": ["1"]}]}', {"Content-Type": "text/plain"}, 415,
     "Content-Type: expected application/json, got 'text/plain'"),
    (V2, json.dumps(v2_items("INT32", [1, 2], [1, 2])).encode(), JSON, 400,
     "items: expected BYTES of shape [B, L], got INT32 [1, 2]"),
    (V2, json.dumps(v2_items("BYTES", [1, 3], ["1", "2"])).encode(), JSON, 400,
     "items: data does not match the declared shape [1, 3] (got 2 values, as [2])"),
    (V2, json.dumps(v2_items("BYTES", [2, 3], [["1", "2"], ["3", "4"], ["5", "6"]])).encode(),
     JSON, 400, "items: data does not match the declared shape [2, 3] (got 6 values, as [3, 2])"),
    (V2, json.dumps(v2_items("BYTES", [1, 2], ["1", 2])).encode(), JSON, 400,
     "items[0]: expected item ids as strings, got 2"),
    (V2, b'{"inputs": 3}', JSON, 400, "inputs: Input should be a valid list"),
    ("/v1/models/other:predict", b'{"instances": [{"items": ["1"]}]}', JSON, 404,
     "Model with name other does not exist."),
    (V1, json.dumps({"instances": [{"items": ["7" * 300]}]}).encode(), JSON, 413,
     "instances[0].items[0]: an item id of 300 bytes, over the limit of 256"),
    (V2, json.dumps(v2_items("BYTES", [1, 1], ["\ud800"])).encode(), JSON, 400,
     "items[0]: an item id that is not UTF-8 text"),
    ("/v1/nowhere", b'{}', JSON, 404, "POST /v1/nowhere: Not Found"),
    ("/v2/models/vaecf/versions/1/infer", json.dumps(v2_items("BYTES", [1, 1], ["1"])).encode(),
     JSON, 404, "POST /v2/models/vaecf/versions/1/infer: Not Found"),
    ("/v2/repository/models/vaecf/unload", b'{}', JSON, 404,
     "POST /v2/repository/models/vaecf/unload: Not Found"),
    ("/v2/health/ready", b'{}', JSON, 405, "POST /v2/health/ready: Method Not Allowed"),
]


@pytest.mark.parametrize(("path", "body", "headers", "status", "message"), BAD,
                         ids=[f"{i}-{b[3]}" for i, b in enumerate(BAD)])
def test_bad_request_gets_a_4xx_with_one_line(server, path: str, body: bytes,
                                              headers: dict[str, str], status: int,
                                              message: str) -> None:
    got, raw = request(server.url, "POST", path, body, headers)
    assert got == status, raw
    answer = json.loads(raw)
    assert list(answer) == ["error"] and answer["error"].startswith(message), answer
    assert "\n" not in answer["error"] and "Traceback" not in answer["error"]
    assert request(server.url, "GET", "/v2/health/ready")[0] == 200


def test_oversized_and_unsized_bodies_are_refused_before_they_are_read(server) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.putrequest("POST", V1)
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(64 * 2**20))
    connection.endheaders()  # the 64 MiB body is never sent: the headers are enough
    response = connection.getresponse()
    assert response.status == 413
    assert json.loads(response.read()) == {
        "error": "request body of 67,108,864 bytes, over the limit of 8,388,608"}
    connection.close()
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.putrequest("POST", V1)
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Transfer-Encoding", "chunked")
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 411 and b"Content-Length: required" in response.read()
    connection.close()


def test_concurrent_clients_each_get_their_own_answer(server, expected) -> None:
    ids = expected.item_ids.tolist()
    rng = np.random.default_rng(0)
    users = [rng.choice(ids, size=int(rng.integers(0, 30)), replace=False).tolist()
             for _ in range(96)]
    truth = expected.recommend(users, [7] * len(users))
    failures: list[str] = []

    def client(first: int) -> None:
        for user in range(first, len(users), 12):
            status, raw = request(server.url, "POST", V1, v1_body([users[user]], k=7), JSON)
            answer = json.loads(raw)["predictions"][0] if status == 200 else raw
            if status != 200 or answer["item_id"] != truth.item_ids[user].tolist():
                failures.append(f"user {user}: {status} {answer}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_sigterm_drains_in_flight_requests_refuses_new_ones_and_exits_0(
        model: Path, expected: ServedModel, tmp_path: Path) -> None:
    """A request whose headers arrived before SIGTERM is answered in full; after SIGTERM the
    port refuses connections; the process exits 0 once the request is done."""
    process = ServerProcess(str(model))
    process.start(tmp_path / "serve.log")
    body = v1_body([expected.item_ids[:50].tolist()] * 64, k=5)
    host, port = process.url.removeprefix("http://").split(":")
    in_flight = http.client.HTTPConnection(host, int(port), timeout=60)
    in_flight.putrequest("POST", V1)
    in_flight.putheader("Content-Type", "application/json")
    in_flight.putheader("Content-Length", str(len(body)))
    in_flight.endheaders(body[:100])  # the request has begun: headers and a first part
    time.sleep(0.5)
    assert process.process is not None
    process.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    while request(process.url, "GET", "/v2/health/ready", timeout=2)[0] != 0:
        assert time.monotonic() < deadline, "still accepting connections 30 s after SIGTERM"
        time.sleep(0.1)
    assert process.process.poll() is None  # still draining: our request is not done
    in_flight.send(body[100:])
    response = in_flight.getresponse()
    assert response.status == 200
    assert len(json.loads(response.read())["predictions"]) == 64
    assert process.process.wait(60) == 0, process.log_tail()


def test_benchmark_serve_reports_every_scenario(model: Path, tmp_path: Path, cli) -> None:
    """The figures' shape, not their values (speed is for the benchmark, never a test)."""
    code, out, err = cli("benchmark-serve", "--model", model, "--output", tmp_path / "bench",
                         "--seconds", "1", "--clients", "1", "2", "--users-per-request", "1",
                         "4", "--items-per-user", "10")
    assert code == 0, err
    result = json.loads((tmp_path / "bench" / "serve_benchmark.json").read_text())
    assert [(r["users_per_request"], r["clients"]) for r in result["runs"]] == [
        (1, 1), (1, 2), (4, 1), (4, 2)]
    assert all(r["errors"] == 0 and r["requests"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0
               for r in result["runs"])
    assert result["server_exit_code"] == 0
    assert set(result["server_rss_bytes"]) == {"before", "after"}
    assert set(result["floors"]) == {"memory_growth", "4_user_requests_vs_in_process"}
    assert "floor memory_growth:" in out
    hostile = result["hostile_client"]
    assert (hostile["clients"], hostile["users_per_request"]) == (2, 1)
    for run in (hostile["alone"], hostile["beside_hostile"]):
        assert run["errors"] == 0 and run["requests"] > 0 and run["p99_ms"] >= run["p50_ms"] > 0
    assert hostile["hostile"]["huge_headers"] > 0 and hostile["hostile"]["slow_connections"] > 0
    assert "beside a huge-header and slowloris client: p99" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--http_port", "0"], "argument --http_port: expected a port from 1 to 65535, got 0"),
    (["--workers", "2"], "--workers 2: vaecf serves from one process"),
    (["--grpc_port", "8080"], "--grpc_port 8080: the same as --http_port"),
    (["--model_name", "Bad/Name"], "--model_name 'Bad/Name': expected lower-case letters"),
    (["--enable_grpc", "maybe"], "argument --enable_grpc: expected true or false, got maybe"),
    (["--request-timeout", "0"], "argument --request-timeout: expected a number of seconds > 0, "
                                 "got 0"),
    (["--request-timeout", "inf"], "argument --request-timeout: expected a number of seconds "
                                   "> 0, got inf"),
    (["--max-header-bytes", "x"], "argument --max-header-bytes: expected a positive integer, "
                                  "got x"),
])
def test_bad_flags_fail_in_one_line_before_loading(cli, tmp_path: Path, argv: list[str],
                                                   message: str) -> None:
    code, _, err = cli("serve", "--model", tmp_path, *argv)  # a folder, but no model
    assert code == 1 and err.startswith(f"vaecf serve: error: {message}"), err
    assert err.count("\n") == 1


def test_a_missing_model_fails_in_one_line(cli, tmp_path: Path) -> None:
    code, _, err = cli("serve", "--model", tmp_path / "absent")
    assert code == 1
    assert err == f"vaecf serve: error: {tmp_path / 'absent'}: input directory does not exist\n"


def test_a_model_in_s3_is_served(model: Path, expected: ServedModel, s3_bucket: str,
                                 tmp_path: Path) -> None:
    """``--model s3://...`` (moto on loopback): downloaded, verified, served."""
    from vaecf.io.storage import upload_dir

    uri = f"s3://{s3_bucket}/models/vaecf"
    upload_dir(model, uri)
    process = ServerProcess(uri)
    process.start(tmp_path / "serve.log")
    try:
        users = users_of(expected)[:1]
        status, raw = request(process.url, "POST", V1, v1_body(users, k=4), JSON)
    finally:
        assert process.stop() == 0, process.log_tail()
    assert status == 200, raw
    assert json.loads(raw)["predictions"][0]["item_id"] == \
        expected.recommend(users, [4]).item_ids[0].tolist()


K_BAD = [  # k as JSON text: v1 and v2 (REST JSON) give the same message after the field name
    ("4294967301", "4294967301"), ("-4294967295", "-4294967295"), ("2.7", "2.7"),
    ("true", "True"), ('"5"', "'5'"), ("1e309", "inf"), ("0", "0"), ("301", "301")]


@pytest.mark.parametrize(("text", "shown"), K_BAD, ids=[k for k, _ in K_BAD])
def test_k_is_checked_the_same_on_v1_and_v2(server, text: str, shown: str) -> None:
    """(v1's JSON parser refuses the literal 1e309 itself: a 400 all the same.)"""
    message = f"expected an integer from 1 to 300, got {shown}"
    status, raw = request(server.url, "POST", V1,
                          b'{"instances": [{"items": ["1"], "k": %s}]}' % text.encode(), JSON)
    v1 = ("request body: malformed JSON (number is infinity" if text == "1e309"
          else f"instances[0].k: {message}")
    assert status == 400 and json.loads(raw)["error"].startswith(v1), raw
    for datatype in ("INT32", "INT64"):
        body = (b'{"inputs": [{"name": "items", "datatype": "BYTES", "shape": [1, 1], "data": '
                b'["1"]}, {"name": "k", "datatype": "%s", "shape": [1], "data": [%s]}]}'
                % (datatype.encode(), text.encode()))
        status, raw = request(server.url, "POST", V2, body, JSON)
        assert (status, json.loads(raw)) == (400, {"error": f"k[0]: {message}"}), datatype


def test_k_out_of_int32_range_over_grpc_is_refused(server) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as bad:
            stub.ModelInfer(pb.ModelInferRequest(model_name="vaecf", inputs=[
                pb.ModelInferRequest.InferInputTensor(
                    name="items", datatype="BYTES", shape=[1, 1],
                    contents=pb.InferTensorContents(bytes_contents=[b"1"])),
                pb.ModelInferRequest.InferInputTensor(
                    name="k", datatype="INT64", shape=[1],
                    contents=pb.InferTensorContents(int64_contents=[4294967301]))]))
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad.value.details() == "k[0]: expected an integer from 1 to 300, got 4294967301"


def test_grpc_raw_bytes_with_a_bad_length_prefix_is_invalid_argument(server) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as bad:
            stub.ModelInfer(pb.ModelInferRequest(model_name="vaecf", inputs=[
                pb.ModelInferRequest.InferInputTensor(name="items", datatype="BYTES",
                                                      shape=[1, 1]),
                pb.ModelInferRequest.InferInputTensor(name="k", datatype="INT32", shape=[1])],
                raw_input_contents=[b"\x09\x00\x00\x00ab", np.int32(5).tobytes()]))
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad.value.details().startswith("items: data does not match the declared shape [1, 1]")


def v2_call(server: ServerProcess, protocol: str, items: list[str], shape: list[int],
            k: int = 5, options: tuple[tuple[str, int], ...] = ()) -> tuple[str, Any]:
    """One v2 request of ``items`` declared as ``shape``, k as [1]: ("ok", the answer) or
    (the error's status, its message), over REST (JSON, binary tensors) or gRPC (contents,
    raw; a channel with ``options``)."""
    if protocol.startswith("rest"):
        if protocol == "rest-json":
            body = v2_items("BYTES", shape, items)
            body["inputs"][1]["data"] = [k]
            status, raw = request(server.url, "POST", V2, json.dumps(body).encode(), JSON)
        else:
            data = b"".join(struct.pack("<I", len(i.encode())) + i.encode() for i in items)
            header = json.dumps({"inputs": [
                {"name": "items", "datatype": "BYTES", "shape": shape,
                 "parameters": {"binary_data_size": len(data)}},
                {"name": "k", "datatype": "INT32", "shape": [1], "data": [k]}]}).encode()
            status, raw = request(server.url, "POST", V2, header + data, {
                "Inference-Header-Content-Length": str(len(header))})
        return ("ok", raw) if status == 200 else (str(status), json.loads(raw)["error"])
    tensors = [pb.ModelInferRequest.InferInputTensor(name="items", datatype="BYTES",
                                                     shape=shape),
               pb.ModelInferRequest.InferInputTensor(name="k", datatype="INT32", shape=[1])]
    call = pb.ModelInferRequest(model_name="vaecf", inputs=tensors)
    if protocol == "grpc-raw":
        call.raw_input_contents.extend([b"".join(struct.pack("<I", len(i.encode())) + i.encode()
                                                 for i in items), np.int32(k).tobytes()])
    else:
        call.inputs[0].contents.bytes_contents.extend(i.encode() for i in items)
        call.inputs[1].contents.int_contents.append(k)
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}", options=options) as channel:
        try:
            return "ok", pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(call, timeout=300)
        except grpc.RpcError as err:
            return err.code().name, err.details()


PROTOCOLS = ["rest-json", "rest-binary", "grpc-contents", "grpc-raw"]
REFUSED = {"rest-json": "400", "rest-binary": "400", "grpc-contents": "INVALID_ARGUMENT",
           "grpc-raw": "INVALID_ARGUMENT"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("shape", "count"), [([-1, 1], 3), ([-2, 1], 4), ([1, -1], 3),
                                              ([3, -1], 3), ([-1, -1], 2)])
def test_a_v2_shape_with_a_size_below_0_is_refused_on_every_protocol(
        server, expected, protocol: str, shape: list[int], count: int) -> None:
    """numpy would fill in a -1 (or any negative size) from the data, so a shape of [-1, 1]
    carried as many users as the body holds past the 1,024 limit: refused, one message."""
    items = expected.item_ids[:count].tolist()
    assert v2_call(server, protocol, items, shape) == (
        REFUSED[protocol], f"items: shape {shape}: expected every size an integer >= 0 (-1 "
                           "marks a free size in the model's metadata, not in a request)")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_v2_limits_hold_on_the_data_on_every_protocol(server, protocol: str) -> None:
    """1,025 users of no item, declared as they are: the user limit, whatever the protocol."""
    assert v2_call(server, protocol, [], [1025, 0]) == (
        "413" if protocol.startswith("rest") else "INVALID_ARGUMENT",
        "items: 1,025 users, over the limit of 1,024 per request")


def test_model_versions_and_the_repository_are_unknown_paths(server) -> None:
    """KServe's versioned paths (501 and a traceback before) and its repository's load and
    unload (any client could unload the model) are 404 with one line, on any method; gRPC's
    unload is refused and the model keeps answering."""
    for method, path in (("GET", "/v2/models/vaecf/versions/1"),
                         ("GET", "/v2/models/vaecf/versions/1/ready"),
                         ("POST", "/v2/repository/models/vaecf/load"),
                         ("POST", "/v2/repository/index")):
        status, raw = request(server.url, method, path, b"{}" if method == "POST" else None,
                              JSON)
        assert (status, json.loads(raw)) == (404, {"error": f"{method} {path}: Not Found"})
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as bad:
            stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="vaecf"))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert stub.ModelReady(pb.ModelReadyRequest(name="vaecf")).ready
    assert request(server.url, "GET", "/v2/models/vaecf/ready")[0] == 200


def raw_exchange(server: ServerProcess, data: bytes, timeout: float = 20) -> bytes:
    """Send raw bytes on a fresh connection; everything the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=timeout) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_bad_http_framing_gets_a_json_400(server) -> None:
    answer = raw_exchange(server, b"POST /v1/models/vaecf:predict HTTP/1.1\r\nContent-Length: "
                                  b"zz\r\n\r\n{}")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"application/json" in head
    assert json.loads(body) == {"error": "malformed HTTP request"}


def test_no_bad_request_writes_a_traceback(server) -> None:
    """Runs after every bad request above (same server): each left one line, no traceback."""
    assert server.log_path is not None
    text = server.log_path.read_text()
    assert "Traceback" not in text, text[text.find("Traceback") - 300:][:3000]
    lines = [line for line in text.splitlines()
             if "instances[0].k: expected an integer from 1 to 300, got 4294967301" in line]
    assert len(lines) == 1 and "refused" in lines[0], lines


def test_a_huge_header_is_cut_short_with_431(server) -> None:
    """The server stops reading a 64 MiB header after its limit: the client cannot even send
    it all (the server closed), and what it answered is a JSON 431."""
    sent, answer = 0, b""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=20) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nX-Big: ")
        try:
            while sent < 64 * 2**20:
                sock.sendall(b"a" * 2**16)
                sent += 2**16
        except OSError:
            pass
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except OSError:
            pass
    assert sent < 16 * 2**20, f"the server read {sent:,} bytes of one header"
    if answer:  # a reset may have dropped it; when it arrived it is the documented 431
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 431 ")
        assert json.loads(body) == {"error": "request line and headers over 32,768 bytes"}
    assert request(server.url, "GET", "/v2/health/ready")[0] == 200


@pytest.fixture(scope="module")
def quick_server(model: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[ServerProcess]:
    """A server that gives a request 2 s to arrive and its headers 4 KiB."""
    process = ServerProcess(str(model), args=("--request-timeout", "2",
                                              "--max-header-bytes", "4096"))
    process.start(tmp_path_factory.mktemp("serve-quick") / "serve.log")
    yield process
    assert process.stop() == 0, process.log_tail()


def test_slow_requests_are_cut_off_while_others_are_answered(quick_server, expected) -> None:
    """Slowloris: half-sent headers, a half-sent body and a silent connection all get a 408
    within the request timeout, and a normal request meanwhile is answered."""
    starts = [b"GET /v2/health/ready HTTP/1.1\r\nX-Slow: a",
              b"POST /v1/models/vaecf:predict HTTP/1.1\r\nContent-Length: 100\r\n\r\n{",
              b""]
    socks = [socket.create_connection(("127.0.0.1", quick_server.http_port), timeout=20)
             for _ in starts]
    for sock, start in zip(socks, starts, strict=True):
        sock.sendall(start)
    status, _ = request(quick_server.url, "POST", V1,
                        v1_body([expected.item_ids[:3].tolist()]), JSON)
    assert status == 200
    for sock in socks:
        answer = b""
        with sock:
            while chunk := sock.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), answer
        assert json.loads(body) == {"error": "request not received in full within 2 s"}
    big = "x" * 5000
    status, raw = request(quick_server.url, "GET", "/v2/health/ready", headers={"X-Big": big})
    assert status == 431, raw


def tied(answer: list[str], scores: list[float], position: dict[str, int]) -> None:
    """Scores descending; equal scores in item order (by item_idx)."""
    pairs = list(zip(answer, scores, strict=True))
    for (a, score_a), (b, score_b) in itertools.pairwise(pairs):
        assert score_a > score_b or (score_a == score_b and position[a] < position[b]), (
            a, score_a, b, score_b)


def test_equal_scores_come_in_item_order(server, expected) -> None:
    """The popularity fallback has many equal scores: ties are broken by item index, the same
    way in every answer."""
    position = {item: i for i, item in enumerate(expected.item_ids.tolist())}
    status, answer = post(server, V1, {"instances": [{"items": [], "k": 300}] * 2})
    assert status == 200
    first = answer["predictions"][0]
    assert len(set(first["scores"])) < len(first["scores"])  # there are ties to break
    tied(first["item_id"], first["scores"], position)
    assert answer["predictions"][1] == first


def test_v2_answers_tritonclient_http_and_grpc_as_shipped(server, expected) -> None:
    """tritonclient 2.51's defaults: no Content-Type, binary tensors both ways (HTTP), raw
    tensor contents (gRPC); and its JSON mode. It runs in its own process (its gRPC stubs
    and KServe's cannot share one)."""
    import subprocess
    import sys

    users = users_of(expected)[:3]
    truth = expected.recommend(users, [5] * 3)
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("triton_client.py")),
         f"127.0.0.1:{server.http_port}", f"127.0.0.1:{server.grpc_port}"],
        input=json.dumps(users), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout)
    assert sorted(answers) == ["grpc", "http_binary", "http_json"]
    for answer in answers.values():
        assert answer["item_id"] == truth.item_ids.tolist()
        np.testing.assert_allclose(answer["scores"], truth.scores, rtol=1e-5)
        assert answer["fallback"] == [False, False, True] and answer["ready"]


def test_kserve_s_own_rest_and_grpc_clients(server, expected) -> None:
    """KServe 0.15.2's InferenceRESTClient (v1 and v2, JSON and binary tensors; it sends no
    Content-Type for JSON) and InferenceGRPCClient."""
    import asyncio

    from kserve import InferenceGRPCClient, InferenceRESTClient, RESTConfig
    from kserve.protocol.infer_type import InferInput, InferRequest

    users = users_of(expected)[:2]
    truth = expected.recommend(users, [4] * 2)

    def v2_request(binary: bool) -> InferRequest:
        items = InferInput("items", [2, 5], "BYTES")
        items.set_data_from_numpy(np.array([u + [""] * (5 - len(u)) for u in users],
                                           dtype=object), binary_data=binary)
        k = InferInput("k", [1], "INT32")
        k.set_data_from_numpy(np.array([4], np.int32), binary_data=binary)
        return InferRequest(model_name="vaecf", infer_inputs=[items, k])

    async def calls() -> list:
        v1 = InferenceRESTClient(RESTConfig(protocol="v1"))
        v2 = InferenceRESTClient(RESTConfig(protocol="v2"))
        answers = [await v1.infer(server.url, {"instances": [{"items": u, "k": 4}
                                                             for u in users]}, "vaecf")]
        answers += [await v2.infer(server.url, v2_request(binary), "vaecf")
                    for binary in (False, True)]
        grpc_client = InferenceGRPCClient(f"127.0.0.1:{server.grpc_port}")
        answers.append(await grpc_client.infer(v2_request(True)))
        await grpc_client.close()
        return answers

    v1, *v2s = asyncio.run(calls())
    assert [p["item_id"] for p in v1["predictions"]] == truth.item_ids.tolist()
    for answer in v2s:
        ids = answer.get_output_by_name("item_id").as_numpy()
        assert [[i.decode() if isinstance(i, bytes) else i for i in row]
                for row in ids] == truth.item_ids.tolist()


@pytest.fixture(scope="module")
def wide_model(synthetic_split, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model of 1,094 items, more than the largest k (1,000): the largest legal answer,
    1,024 users x 1,000 places, is ~12 MB over gRPC (past KServe's default 8 MiB send limit)
    and ~17 MB of v1 JSON."""
    from vaecf.cli import main

    output = tmp_path_factory.mktemp("wide-model") / "model"
    assert main(["train", "--split", str(synthetic_split(1200, 1500)), "--output", str(output),
                 "--epochs", "1", "--batch-size", "200", "--hidden", "16", "--latent",
                 "8"]) == 0
    return output


@pytest.fixture(scope="module")
def wide_server(wide_model: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[ServerProcess]:
    process = ServerProcess(str(wide_model), args=("--request-timeout", "10"))
    process.start(tmp_path_factory.mktemp("serve-wide") / "serve.log")
    yield process
    assert process.stop() == 0, process.log_tail()


def largest_v1(ids: list[str]) -> list[bytes]:
    """The largest legal v1 requests, each at the largest k and within the 8 MiB body: the
    largest answer (1,024 users of one item: 1,000 places each), the most items (1,024 users
    x 1,000) and the longest user (10,000 items)."""
    bodies = [v1_body([ids[:1]] * 1024, k=1000), v1_body([ids[:1000]] * 1024, k=1000),
              v1_body([(ids * (10_000 // len(ids) + 1))[:10_000]], k=1000)]
    assert all(len(body) <= 8 * 2**20 for body in bodies)
    return bodies


def test_the_largest_legal_requests_leave_memory_where_it_was(wide_server, wide_model) -> None:
    """Two rounds of the largest requests, then four clients that send the request of the
    largest answer (~17 MB), take its first byte and read no more: the server closes them after the
    request timeout, and its resident memory ends within 5% of where it was after warm-up
    and ordinary requests."""
    ids = ServedModel.load(str(wide_model)).item_ids.tolist()
    ordinary = v1_body([ids[:30]] * 8, k=20)
    for _ in range(20):
        assert request(wide_server.url, "POST", V1, ordinary, JSON)[0] == 200
    before = wide_server.rss_bytes()
    rounds = []
    for _ in range(2):
        for body in largest_v1(ids):
            status, raw = request(wide_server.url, "POST", V1, body, JSON, timeout=300)
            assert status == 200, raw[:300]
        assert request(wide_server.url, "POST", V1, ordinary, JSON)[0] == 200
        rounds.append(wide_server.rss_bytes())
    body = largest_v1(ids)[0]
    unread = []
    for _ in range(4):
        sock = socket.create_connection(("127.0.0.1", wide_server.http_port), timeout=300)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (V1.encode(), len(body), body))
        assert sock.recv(1) == b"H"  # the answer has begun: it is computed, then left unread
        unread.append(sock)
    assert wide_server.log_path is not None
    deadline = time.monotonic() + 300
    while wide_server.log_path.read_text().count("answer not read for 10 s") < 4:
        assert time.monotonic() < deadline, wide_server.log_tail()
        time.sleep(0.5)
    for sock in unread:
        sock.close()
    assert request(wide_server.url, "POST", V1, ordinary, JSON)[0] == 200
    rounds.append(wide_server.rss_bytes())
    shown = " -> ".join(f"{r / 2**20:.0f}" for r in [before, *rounds]) + " MiB"
    assert max(rounds) <= before * 1.05, shown


@pytest.mark.parametrize("protocol", ["grpc-raw", "grpc-contents"])
def test_the_largest_legal_answer_is_sent_over_grpc(wide_server, wide_model,
                                                    protocol: str) -> None:
    """1,024 users at k 1,000 (every limit at its largest) is answered over gRPC: the send
    limit is sized from the largest legal answer, not KServe's 8 MiB."""
    served = ServedModel.load(str(wide_model))
    user = served.item_ids[:1].tolist()
    status, reply = v2_call(wide_server, protocol, user * 1024, [1024, 1], k=1000,
                            options=(("grpc.max_receive_message_length", -1),))
    assert status == "ok", reply
    assert reply.ByteSize() > 8 * 2**20
    item_id = next(o for o in reply.outputs if o.name == "item_id")
    assert list(item_id.shape) == [1024, 1000]
    first = (deserialize_bytes_tensor(reply.raw_output_contents[0])[:1000]
             if protocol == "grpc-raw" else item_id.contents.bytes_contents[:1000])
    answer = [i.decode() for i in first]  # 1,000 distinct known ids, never the user's own
    assert len(set(answer)) == 1000 and set(answer) <= set(served.item_ids) - set(user)


def test_sigterm_stops_grpc_taking_calls_while_rest_drains(model: Path, expected,
                                                           tmp_path: Path) -> None:
    """After SIGTERM, with a REST request still in flight, a new gRPC call is refused at once
    (not answered for the whole REST drain); the REST request is answered; exit 0."""
    process = ServerProcess(str(model))
    process.start(tmp_path / "serve.log")
    body = v1_body([expected.item_ids[:5].tolist()], k=5)
    in_flight = http.client.HTTPConnection("127.0.0.1", process.http_port, timeout=60)
    in_flight.putrequest("POST", V1)
    in_flight.putheader("Content-Type", "application/json")
    in_flight.putheader("Content-Length", str(len(body)))
    in_flight.endheaders(body[:10])
    call = pb.ModelInferRequest(model_name="vaecf", inputs=[
        pb.ModelInferRequest.InferInputTensor(
            name="items", datatype="BYTES", shape=[1, 1],
            contents=pb.InferTensorContents(bytes_contents=[b"1"])),
        pb.ModelInferRequest.InferInputTensor(
            name="k", datatype="INT32", shape=[1],
            contents=pb.InferTensorContents(int_contents=[3]))])
    with grpc.insecure_channel(f"127.0.0.1:{process.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        stub.ModelInfer(call, timeout=10)  # the channel is up
        assert process.process is not None
        process.process.send_signal(signal.SIGTERM)
        time.sleep(2)
        assert process.process.poll() is None  # still draining the REST request
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(call, timeout=10)
        assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE,
                                        grpc.StatusCode.CANCELLED)
    in_flight.send(body[10:])
    response = in_flight.getresponse()
    assert response.status == 200
    assert process.process.wait(60) == 0, process.log_tail()


def test_the_serving_guide_gives_the_flags_defaults(cli) -> None:
    import re

    guide = (Path(__file__).parents[2] / "docs" / "how-to" / "serving.md").read_text()
    for flag, default in (("--max-batch-users", "256"), ("--max-header-bytes", "32,768"),
                          ("--request-timeout", "30 s")):
        assert re.search(rf"`{flag}`\s+\(default\s+{default}\)", guide), flag
    from vaecf.stages.serve import build_parser

    defaults = {a.dest: a.default for a in build_parser()._actions}
    assert (defaults["max_batch_users"], defaults["max_header_bytes"],
            defaults["request_timeout"]) == (256, 32768, 30.0)
