"""A call to a ``RolloutServer`` replica that survives the replica dying (deployments layer).

Generate requests are token-in, so another replica can take one whole: with a seed it samples the same turn again,
without one a new sample of it; nothing of the try that died was recorded anywhere (an answer is recorded once it
returns). The agent workers' ``HandleGenerator`` and the OpenAI ingress both go through ``call_surviving_deaths``.
After ``max_retries`` deaths in a row it raises ``ReplicaLost`` naming the request (the ingress answers it with a 503).
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

    def __init__(self, message: str, attempts: int):
        super().__init__(message)
        self.attempts = attempts

    def __reduce__(self):  # it crosses actor boundaries (an agent worker's group to the coordinator): rebuilt whole
        return type(self), (str(self), self.attempts)


async def call_surviving_deaths(call: Callable[[], Awaitable[T]], what: str, max_retries: int = DEFAULT_MAX_RETRIES,
                                on_retry: Callable[[], None] | None = None) -> T:
    """``await call()``; when its replica dies (or is unreachable) mid-request, call again, up to ``max_retries``
    times (``on_retry`` counts each); then ``ReplicaLost`` (``what`` names the request in its message)."""
    for attempt in range(max_retries + 1):
        try:
            return await call()
        except REPLICA_GONE as exc:
            if attempt == max_retries:
                raise ReplicaLost(f"{what}: its replica died {attempt + 1} times in a row ({type(exc).__name__})",
                                  attempt + 1) from exc
            if on_retry is not None:
                on_retry()
    raise AssertionError("unreachable")
