"""A call to a ``RolloutServer`` replica that survives the replica dying (deployments layer).

Generate requests are token-in with their own seed, so sending one again to another replica regenerates the same
turn: the agent workers' ``HandleGenerator`` and the OpenAI ingress both go through ``call_surviving_deaths``. After
``max_retries`` deaths in a row it raises ``ReplicaLost`` naming the request (the ingress answers it with a 503).
"""

from __future__ import annotations

from typing import Awaitable, Callable, TypeVar

import ray
from ray.serve.exceptions import ReplicaUnavailableError

T = TypeVar("T")
# the replica died, is unreachable, or left the router's set between its choice and the send
REPLICA_GONE = (ray.exceptions.RayActorError, ReplicaUnavailableError)

DEFAULT_MAX_RETRIES = 3  # a request whose replica died goes to another replica this many times


class ReplicaLost(RuntimeError):
    """Every replica a request was sent to died under it (``attempts`` times in a row)."""

    def __init__(self, what: str, attempts: int, cause: BaseException):
        super().__init__(f"{what}: its replica died {attempts} times in a row ({type(cause).__name__})")
        self.attempts = attempts


async def call_surviving_deaths(call: Callable[[], Awaitable[T]], what: str, max_retries: int = DEFAULT_MAX_RETRIES,
                                on_retry: Callable[[], None] | None = None) -> T:
    """``await call()``; when its replica dies (or is unreachable) mid-request, call again, up to ``max_retries``
    times (``on_retry`` counts each); then ``ReplicaLost`` (``what`` names the request in its message)."""
    for attempt in range(max_retries + 1):
        try:
            return await call()
        except REPLICA_GONE as exc:
            if attempt == max_retries:
                raise ReplicaLost(what, attempt + 1, exc) from exc
            if on_retry is not None:
                on_retry()
    raise AssertionError("unreachable")
