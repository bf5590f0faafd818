"""The KServe predictor: ``load`` (and warm up), then ``predict`` for v1 and v2 alike.

Requests that arrive while the model is busy wait and then go into the model together: one
``recommend_ids`` call serves every user of every waiting request (up to ``max_batch_users``).
Nothing is delayed on purpose (no batching window): an idle server answers a lone request at
once, a busy one amortises the call over the queue. The call runs in a worker thread, so the
event loop keeps parsing and answering requests meanwhile (TensorFlow releases the GIL).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from kserve import Model
from kserve.protocol.infer_type import InferRequest, InferResponse

from vaecf import log
from vaecf.serve.model import Ranking, ServedModel
from vaecf.serve.protocol import (
    INPUTS,
    MAX_K,
    OUTPUTS,
    Batch,
    parse_v1,
    parse_v2,
    v1_response,
    v2_response,
)

Waiting = tuple[Batch, "asyncio.Future[Ranking]"]
DEFAULT_BATCH_USERS = 256  # users per model call: 32 clients x 8 users in one go
WARM_UP_ITEMS = 200  # items per warm-up user (ML-20M users average 73 after filtering)


class Predictor(Model):
    """One vaecf model behind KServe's v1 and v2 endpoints (REST and gRPC).

    Args:
      name: the model name in the endpoints' paths (``/v1/models/<name>:predict``).
      model_uri: a ``vaecf train`` output, local or s3://.
      max_batch_users: most users in one model call (several requests together).
    """

    def __init__(self, name: str, model_uri: str,
                 max_batch_users: int = DEFAULT_BATCH_USERS) -> None:
        super().__init__(name)
        self.model_uri = model_uri
        self.max_batch_users = max_batch_users
        self.served: ServedModel | None = None
        self._waiting: collections.deque[Waiting] = collections.deque()
        self._running = False

    def load(self) -> bool:
        """Load, verify and warm up, then ready.

        The warm-up calls build TensorFlow's kernels and grow its allocator to the largest
        batch the server will form (``max_batch_users`` users of ``WARM_UP_ITEMS`` items), so
        that serving starts at its steady memory instead of growing under the first load.
        """
        served = ServedModel.load(self.model_uri)
        items = served.item_ids[:WARM_UP_ITEMS].tolist()
        for users in sorted({1, 32, self.max_batch_users}):
            served.recommend([items] * users, [MAX_K] * users)
        self.served = served
        log.info(f"model {self.name}: {served.n_items:,} items from {self.model_uri}, warmed up")
        self.ready = True
        return True

    def get_input_types(self) -> list[dict[str, Any]]:
        return INPUTS

    def get_output_types(self) -> list[dict[str, Any]]:
        return OUTPUTS

    def validate(self, payload: Any) -> Any:
        return payload  # every check is in ``protocol``, with messages naming the field

    async def predict(self, payload: Any, headers: dict[str, str] | None = None,
                      response_headers: dict[str, str] | None = None
                      ) -> dict[str, Any] | InferResponse:
        assert self.served is not None, "predict before load"
        if isinstance(payload, InferRequest):
            batch = parse_v2(payload, self.served.n_items)
            ranking = await self._rank(batch)
            return v2_response(ranking, self.name, payload.id or "")
        batch = parse_v1(payload, self.served.n_items)
        return v1_response(await self._rank(batch), batch)

    async def _rank(self, batch: Batch) -> Ranking:
        """This request's rows of the next model call (which may serve other requests too)."""
        future: asyncio.Future[Ranking] = asyncio.get_running_loop().create_future()
        self._waiting.append((batch, future))
        if not self._running:
            self._running = True
            asyncio.get_running_loop().create_task(self._run_queue())
        return await future

    async def _run_queue(self) -> None:
        try:
            while self._waiting:
                taken = self._take()
                users = [items for batch, _ in taken for items in batch.users]
                ks = [k for batch, _ in taken for k in batch.k]
                assert self.served is not None
                try:
                    ranking = await asyncio.get_running_loop().run_in_executor(
                        None, self.served.recommend, users, ks)
                except Exception as err:
                    for _, future in taken:
                        if not future.done():
                            future.set_exception(err)
                    continue
                start = 0
                for batch, future in taken:
                    stop = start + len(batch.users)
                    if not future.done():  # a client that went away cancels its future
                        future.set_result(ranking.rows(start, stop, max(batch.k)))
                    start = stop
        finally:
            self._running = False

    def _take(self) -> list[Waiting]:
        """The longest prefix of the queue within ``max_batch_users`` (at least one request)."""
        taken = [self._waiting.popleft()]
        users = len(taken[0][0].users)
        while self._waiting and users + len(self._waiting[0][0].users) <= self.max_batch_users:
            users += len(self._waiting[0][0].users)
            taken.append(self._waiting.popleft())
        return taken
