"""``vaecf benchmark-serve``: load a real ``vaecf serve`` process and compare with the floors.

Scenarios: every (concurrent clients, users per request) pair, each run for ``seconds`` with
closed-loop clients on loopback; the server's resident memory is read before and after each
scenario, and growth is reported over the whole run and over the floor's own scenario. The
same ``recommend_ids`` signature called in this process on requests of the largest size gives
the ceiling that batched requests are compared with. Last, the most clients with the smallest
requests run twice more, alone and beside a ``Hostile`` client (huge headers and slowloris
connections): their p99 with and without it shows whether one bad client delays the others.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vaecf import log
from vaecf.serve.loadtest import Hostile, ServerProcess, in_process_rate, load, v1_body
from vaecf.serve.model import ServedModel

PATH = "/v1/models/vaecf:predict"
# The floors on the 2-core development machine (ML-20M-sized model, 20,108 items).
FLOOR_P50_MS, FLOOR_P99_MS, FLOOR_CLIENTS = 10.0, 50.0, 8
FLOOR_MEMORY_GROWTH, FLOOR_BATCH_SHARE = 0.05, 0.5


@dataclass(frozen=True)
class ServeBenchmarkConfig:
    """``vaecf benchmark-serve`` flags (defaults: the parser's) and the k every request asks."""

    model: str
    clients: tuple[int, ...]
    users_per_request: tuple[int, ...]
    seconds: float
    items_per_user: int
    seed: int
    k: int = 20


def bodies(item_ids: np.ndarray, users: int, config: ServeBenchmarkConfig,
           count: int = 256) -> list[bytes]:
    """``count`` v1 request bodies of ``users`` random users each (seeded)."""
    rng = np.random.default_rng(config.seed)
    return [v1_body(sample_users(rng, item_ids, users, config), config.k)
            for _ in range(count)]


def sample_users(rng: np.random.Generator, item_ids: np.ndarray, users: int,
                 config: ServeBenchmarkConfig) -> list[list[str]]:
    """``users`` users of ``config.items_per_user`` distinct random known items each."""
    size = min(config.items_per_user, item_ids.size)
    return [rng.choice(item_ids, size, replace=False).tolist() for _ in range(users)]


def run_serve_benchmark(config: ServeBenchmarkConfig, log_dir: Path) -> dict[str, Any]:
    """Every scenario against one server process; the result as ``serve_benchmark.json``."""
    model = ServedModel.load(config.model)
    item_ids, largest = model.item_ids, max(config.users_per_request)
    sample = sample_users(np.random.default_rng(config.seed), item_ids, largest, config)
    in_process = in_process_rate(model, sample, config.k, min(config.seconds, 20.0))
    log.info(f"in-process recommend_ids, {largest} users per call: {in_process:,.0f} users/s")
    del model
    runs = []
    server = ServerProcess(config.model)
    server.start(log_dir / "serve.log")
    try:
        memory_before = server.rss_bytes()
        for users in config.users_per_request:
            payloads = bodies(item_ids, users, config)
            for clients in config.clients:
                rss_before = server.rss_bytes()
                result = load(server.url, PATH, payloads, users, clients, config.seconds)
                rss_after = server.rss_bytes()
                log.info(f"{clients:>3} clients x {users:>3} users/request: p50 "
                         f"{result.p50_ms} ms, p99 {result.p99_ms} ms, "
                         f"{result.users_per_second:,.0f} users/s, {result.errors} errors, "
                         f"server memory {rss_before / 2**20:,.0f} -> "
                         f"{rss_after / 2**20:,.0f} MiB")
                runs.append({**result.as_dict(), "rss_before_bytes": rss_before,
                             "rss_after_bytes": rss_after})
        memory_after = server.rss_bytes()
        hostile = beside_hostile(server, item_ids, config)
    finally:
        code = server.stop()
    return {"config": asdict(config), "in_process_users_per_second": round(in_process, 1),
            "server_rss_bytes": {"before": memory_before, "after": memory_after},
            "server_exit_code": code, "runs": runs, "hostile_client": hostile,
            "floors": floors(runs, in_process, memory_before, memory_after, largest)}


def beside_hostile(server: ServerProcess, item_ids: np.ndarray,
                   config: ServeBenchmarkConfig) -> dict[str, Any]:
    """The most clients with the smallest requests, alone and then beside ``Hostile``."""
    clients, users = max(config.clients), min(config.users_per_request)
    payloads = bodies(item_ids, users, config)
    alone = load(server.url, PATH, payloads, users, clients, config.seconds)
    with Hostile(server.url) as hostile:
        beside = load(server.url, PATH, payloads, users, clients, config.seconds)
    log.info(f"{clients} clients x {users} users/request beside a huge-header and slowloris "
             f"client: p99 {beside.p99_ms} ms ({alone.p99_ms} ms alone), p50 {beside.p50_ms} "
             f"ms ({alone.p50_ms}), {beside.errors} errors; the hostile client sent "
             f"{hostile.huge_headers:,} huge headers ({hostile.huge_bytes_sent / 2**20:,.0f} "
             f"MiB) and opened {hostile.slow_connections:,} slow connections")
    return {"clients": clients, "users_per_request": users, "alone": alone.as_dict(),
            "beside_hostile": beside.as_dict(), "hostile": hostile.as_dict()}


def floors(runs: list[dict[str, Any]], in_process: float, memory_before: int,
           memory_after: int, largest: int) -> dict[str, Any]:
    """Each floor of the issue with the measured value; None where no run measured it."""
    def run(clients: int, users: int) -> dict[str, Any] | None:
        return next((r for r in runs if r["clients"] == clients
                     and r["users_per_request"] == users), None)

    single = run(FLOOR_CLIENTS, 1)
    batched = max((r["users_per_second"] for r in runs if r["users_per_request"] == largest),
                  default=None)
    growth = (memory_after - memory_before) / memory_before
    checks: dict[str, Any] = {"memory_growth": {"value": round(growth, 4),
                                                "floor": f"< {FLOOR_MEMORY_GROWTH}",
                                                "met": growth < FLOOR_MEMORY_GROWTH}}
    if single is not None:
        own = (single["rss_after_bytes"] - single["rss_before_bytes"]) / single[
            "rss_before_bytes"]
        checks["memory_growth_single_user_8_clients"] = {
            "value": round(own, 4), "floor": f"< {FLOOR_MEMORY_GROWTH}",
            "met": own < FLOOR_MEMORY_GROWTH}
        checks["single_user_8_clients"] = {
            "p50_ms": single["p50_ms"], "p99_ms": single["p99_ms"], "errors": single["errors"],
            "floor": f"p50 <= {FLOOR_P50_MS} ms, p99 <= {FLOOR_P99_MS} ms, 0 errors",
            "met": (single["p50_ms"] <= FLOOR_P50_MS and single["p99_ms"] <= FLOOR_P99_MS
                    and single["errors"] == 0)}
    if batched is not None:
        share = batched / in_process
        checks[f"{largest}_user_requests_vs_in_process"] = {
            "value": round(share, 3), "floor": f">= {FLOOR_BATCH_SHARE}",
            "met": share >= FLOOR_BATCH_SHARE}
    return checks
