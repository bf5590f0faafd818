# shellcheck shell=bash
# vaecf-serve: `vaecf serve` of the model the CPU train image trained (sourced by
# docker/check-images.sh).

# The server and its clients run inside the serve image, on its loopback (chroot isolation
# shares the host's network namespace; the clients use 127.0.0.1 only).
check_serve() {
  say "serve as uid $RUN_UID: one v1 and one v2 request, then SIGTERM"
  local out
  out=$(in_image serve "$RUN_UID" python -c '
import json, pathlib
from vaecf.serve.loadtest import ServerProcess, request
server = ServerProcess("/data/model")
server.start(pathlib.Path("/tmp/serve.log"))
json_type = {"Content-Type": "application/json"}
v1 = request(server.url, "POST", "/v1/models/vaecf:predict",
             json.dumps({"instances": [{"items": [], "k": 5}]}).encode(), json_type)
v2 = request(server.url, "POST", "/v2/models/vaecf/infer", json.dumps({"inputs": [
    {"name": "items", "datatype": "BYTES", "shape": [1, 1], "data": ["no-such-item"]},
    {"name": "k", "datatype": "INT32", "shape": [1], "data": [5]}]}).encode(), json_type)
code = server.stop()
assert v1[0] == 200 and len(json.loads(v1[1])["predictions"][0]["item_id"]) == 5, v1
outputs = {o["name"]: o for o in json.loads(v2[1])["outputs"]} if v2[0] == 200 else v2
assert outputs["item_id"]["shape"] == [1, 5] and outputs["fallback"]["data"] == [True], v2
assert code == 0, f"exit status {code} after SIGTERM: {server.log_tail()}"
print("serve ok")
') || fail "vaecf serve in vaecf-serve: $out"
  grep -q '^serve ok$' <<< "$out" || fail "vaecf serve in vaecf-serve: $out"
}
