"""The KServe predictor: ``load`` (and warm up), then ``predict`` for v1 and v2 alike.

Requests that arrive while the model is busy wait and then go into the model together: one
``recommend_ids`` call serves every user of every waiting request (up to ``max_batch_users``).
Nothing is delayed on purpose (no batching window): an idle server answers a lone request at
once, a busy one amortises the call over the queue. The call runs in a worker thread, so the
event loop keeps parsing and answering requests meanwhile (TensorFlow releases the GIL).

No model call is larger than the warm-up's: at most ``max_batch_users`` users and
``max_batch_users x WARM_UP_ITEMS`` padded item cells (users x the longest item list of the
call). A larger request is served by several calls, so the largest legal request needs no
memory the warm-up did not already take, and the server's memory stays where it started.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence, Sized
from typing import Any

import numpy as np
from kserve import Model
from kserve.protocol.infer_type import InferRequest, InferResponse

from vaecf import log
from vaecf.serve import heap
from vaecf.serve.model import Ranking, ServedModel
from vaecf.serve.protocol import (
    INPUTS,
    MAX_ITEMS,
    MAX_K,
    OUTPUTS,
    Batch,
    max_answer_bytes,
    parse_v1,
    parse_v2,
    v1_response,
    v2_response,
)

Waiting = tuple[Batch, "asyncio.Future[Ranking]"]
WARM_UP_ITEMS = 200  # items per warm-up user (ML-20M users average 73 after filtering)


def calls(users: Sequence[Sized], max_users: int, max_cells: int) -> list[tuple[int, int]]:
    """``users`` cut into consecutive model calls: (start, stop) pairs, each of at most
    ``max_users`` users and ``max_cells`` padded cells (users x the call's longest list)."""
    cuts, start, width = [], 0, 1
    for stop, items in enumerate(users):
        wider = max(width, len(items), 1)
        if stop > start and (stop - start >= max_users or (stop + 1 - start) * wider > max_cells):
            cuts.append((start, stop))
            start, wider = stop, max(len(items), 1)
        width = wider
    cuts.append((start, len(users)))
    return cuts


class Predictor(Model):
    """One vaecf model behind KServe's v1 and v2 endpoints (REST and gRPC).

    Args:
      name: the model name in the endpoints' paths (``/v1/models/<name>:predict``).
      model_uri: a ``vaecf train`` output, local or s3://.
      max_batch_users: most users in one model call (several requests together).
    """

    def __init__(self, name: str, model_uri: str, max_batch_users: int) -> None:
        super().__init__(name)
        self.model_uri = model_uri
        self.max_batch_users = max_batch_users
        self.served: ServedModel | None = None
        self._waiting: collections.deque[Waiting] = collections.deque()
        self._running = False

    @property
    def max_cells(self) -> int:
        """Most padded item cells (users x longest list) in one model call: the warm-up's."""
        return max(self.max_batch_users * WARM_UP_ITEMS, MAX_ITEMS)

    @property
    def max_answer_bytes(self) -> int:
        """The largest answer the request limits allow for this model's ids (gRPC's send
        limit)."""
        assert self.served is not None, "max_answer_bytes before load"
        return max_answer_bytes(self.served.n_items, self.served.id_bytes)

    def load(self) -> bool:
        """Load, verify and warm up, then ready.

        The warm-up calls build TensorFlow's kernels and grow its allocator to the largest
        calls the server will make (``max_cells`` item cells, as one user, 32 users and
        ``max_batch_users`` users, each asking for ``MAX_K``), so that serving starts at its
        steady memory instead of growing under the first large request.
        """
        served = ServedModel.load(self.model_uri)
        ids = served.item_ids.tolist()
        row = ids * (MAX_ITEMS // len(ids) + 1)  # known ids, repeated if the model has few
        for users in sorted({1, 32, self.max_batch_users}):
            width = min(self.max_cells // users, MAX_ITEMS)
            served.recommend([row[:width]] * users, [MAX_K] * users)
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
            return v2_response(ranking, payload, self.name)
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
        places = 0  # answered since the queue was last empty
        try:
            while self._waiting:
                taken = self._take()
                users = [items for batch, _ in taken for items in batch.users]
                ks = [k for batch, _ in taken for k in batch.k]
                places += sum(ks)
                try:
                    ranking = await self._recommend(users, ks)
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
        if places >= heap.GIVE_BACK_PLACES:  # the requests' parsing and model calls are over
            heap.give_back()

    async def _recommend(self, users: list[np.ndarray], ks: list[int]) -> Ranking:
        """One model call per slice of ``calls``, in a worker thread, joined into one."""
        assert self.served is not None
        loop = asyncio.get_running_loop()
        parts = [await loop.run_in_executor(None, self.served.recommend, users[start:stop],
                                            ks[start:stop])
                 for start, stop in calls(users, self.max_batch_users, self.max_cells)]
        return parts[0] if len(parts) == 1 else Ranking.join(parts)

    def _take(self) -> list[Waiting]:
        """The longest prefix of the queue within ``max_batch_users`` (at least one request)."""
        taken = [self._waiting.popleft()]
        users = len(taken[0][0].users)
        while self._waiting and users + len(self._waiting[0][0].users) <= self.max_batch_users:
            users += len(self._waiting[0][0].users)
            taken.append(self._waiting.popleft())
        return taken
