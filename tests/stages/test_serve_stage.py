"""``vaecf serve`` as a real server process on loopback, with real HTTP and gRPC clients:
v1 rows and TF Serving columns, v2 REST and gRPC, every bad request, concurrent clients, and
SIGTERM draining in-flight requests."""

from __future__ import annotations

import http.client
import json
import signal
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


BAD = [  # path, body, headers, status, message (start of it)
    (V1, b'{"instances": [', JSON, 400, "Unrecognized request format"),
    (V2, b'{"inputs": [', JSON, 400, "request body: malformed JSON"),
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
    (V1, b'{"instances": [{"items": ["1"]}]}', {}, 415,
     "Content-Type: expected application/json, none given"),
    (V1, b'{"instances": [{"items": ["1"]}]}', {"Content-Type": "text/plain"}, 415,
     "Content-Type: expected application/json, got 'text/plain'"),
    (V2, json.dumps(v2_items("INT32", [1, 2], [1, 2])).encode(), JSON, 400,
     "items: expected BYTES of shape [B, L], got INT32 [1, 2]"),
    (V2, json.dumps(v2_items("BYTES", [1, 3], ["1", "2"])).encode(), JSON, 400,
     "inputs: data does not match the declared shape"),
    (V2, json.dumps(v2_items("BYTES", [1, 2], ["1", 2])).encode(), JSON, 400,
     "items[0]: expected item ids as strings, got 2"),
    (V2, b'{"inputs": 3}', JSON, 400, "inputs: Input should be a valid list"),
    ("/v1/models/other:predict", b'{"instances": [{"items": ["1"]}]}', JSON, 404,
     "Model with name other does not exist."),
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


@pytest.mark.parametrize(("argv", "message"), [
    (["--http_port", "0"], "argument --http_port: expected a port from 1 to 65535, got 0"),
    (["--workers", "2"], "--workers 2: vaecf serves from one process"),
    (["--grpc_port", "8080"], "--grpc_port 8080: the same as --http_port"),
    (["--model_name", "Bad/Name"], "--model_name 'Bad/Name': expected lower-case letters"),
    (["--enable_grpc", "maybe"], "argument --enable_grpc: expected true or false, got maybe"),
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
