"""``agent_lightning`` with Agent Lightning 0.3.x: episodes run by the runners of an ``agl.Trainer`` whose algorithm
is tandem-rl's (``tandem_rl_agl.TandemRL``), driven through the trainer's ``LightningStore`` over HTTP (agents layer:
asyncio + httpx; no ``agentlightning`` import, which lives in the trainer's own environment).

0.3.x's ``Trainer.fit`` forks ``n_runners`` runner processes and serves its store (``LightningStoreServer``, REST
under ``/v1/agl``); an algorithm enqueues rollouts and reads what the runners leave. One episode is one rollout:

1. ``POST /v1/agl/queues/rollouts/enqueue``: its input is the task (the row's ``extra_info.agl_task``, as
   ``TandemRL`` writes each dataset item; a row without one gets the input the 1.x loop builds), mode ``train`` or
   ``val``, the group in its metadata;
2. a runner claims it and calls the agent's ``rollout(task, resources, rollout)``. The resource ``main_llm`` (a
   ``ProxyLLM`` on the rollout app's ingress, which ``TandemRL`` adds) gives the base URL
   ``<ingress>/rollout/{rollout_id}/attempt/{attempt_id}/v1``, so the ingress records every call token-exactly under
   that attempt (``agl_session_id``); no proxy sits in between;
3. ``POST /v1/agl/waits/rollouts`` until the rollout is ``succeeded``, ``failed`` or ``cancelled``;
4. the reward is the attempt's last reward span: ``agentlightning.reward.0.value``, which a float returned by the
   agent and ``emit_reward`` both write (a legacy ``agentlightning.annotation`` span's ``reward`` too), as
   ``agl.find_final_reward`` reads it;
5. the calls come from the ingress (``GET /v1/sessions/agl:{rollout_id}:{attempt_id}``) and are joined token-exactly
   (``merge_session_calls``), as in the 1.x loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from agents.loops.agent_lightning import AglSettings, RolloutFailed, RolloutRecord, agl_request, rollout_input
from agents.loops.episode import Episode
from agents.loops.session_merge import SessionCall, agl_session_id

log = logging.getLogger("tandem_rl.agents")

FINISHED = ("succeeded", "failed", "cancelled")
REWARD_KEY = "agentlightning.reward.0.value"  # the primary reward dimension (what a float return becomes)
ANNOTATION = "agentlightning.annotation"
TASK_KEY = "agl_task"  # extra_info key holding the dataset item as the user gave it to Trainer.fit


def span_reward(span: Mapping[str, Any]) -> float | None:
    """The primary reward a span carries, or None (the two encodings ``agl.get_reward_value`` reads besides
    AgentOps' deprecated one)."""
    attributes = span.get("attributes") or {}
    value = attributes.get(REWARD_KEY)
    if value is None and span.get("name") == ANNOTATION:
        value = attributes.get("reward")
    return None if value is None else float(value)


def final_reward(spans: Sequence[Mapping[str, Any]]) -> tuple[float | None, int]:
    """The last reward among ``spans`` (in sequence order) and how many reward spans there were."""
    rewards = [r for r in (span_reward(s) for s in sorted(spans, key=lambda s: s.get("sequence_id", 0)))
               if r is not None]
    return (rewards[-1] if rewards else None), len(rewards)


class AglStoreClient:
    """One agent worker's connection to an Agent Lightning 0.3.x store, and to the ingress that records the calls."""

    def __init__(self, settings: AglSettings, openai_base_url: str, openai_api_key: str = ""):
        if not openai_base_url:
            raise ValueError("the agent_lightning loop needs the rollout app's OpenAI URL (AgentContext.openai_base_url)")
        if not settings.store_url:
            raise ValueError("AglStoreClient needs agent_lightning.store_url (the Agent Lightning 0.3.x store)")
        self.settings = settings
        self._store = httpx.AsyncClient(base_url=f"{settings.store_url}/v1/agl", timeout=30.0)
        headers = {"Authorization": f"Bearer {openai_api_key}"} if openai_api_key else {}
        self._ingress = httpx.AsyncClient(base_url=openai_base_url.rstrip("/"), headers=headers, timeout=30.0)

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        who = f"Agent Lightning store {self.settings.store_url}"
        return (await agl_request(self._store, who, method, path, **kwargs)).json()

    async def run(self, episode: Episode, *, is_train: bool) -> RolloutRecord:
        """Enqueue the episode's rollout, wait for it, read its reward spans and its recorded calls."""
        s = self.settings
        task = episode.extra_info.get(TASK_KEY)
        body = {"rollouts": [{
            "input": task if task is not None else rollout_input(episode, s.input_fields),
            "mode": "train" if is_train else "val",
            "config": {"timeout_seconds": s.timeout_s},
            "metadata": {"group_id": episode.group_id, "sample_index": episode.sample_index,
                         "admitted_at_version": episode.step, "trajectory_id": episode.trajectory_id},
        }]}
        (rollout,) = await self._request("POST", "/queues/rollouts/enqueue", json=body)
        rid = rollout["rollout_id"]
        try:
            rollout = await self._wait(rid)
        except asyncio.CancelledError:  # the run abandoned the group: cancel it in the store, where it shows
            await asyncio.shield(self._cancel(rid))
            raise
        attempt = rollout.get("attempt") or {}
        aid = attempt.get("attempt_id")
        if rollout["status"] != "succeeded" or not aid:
            return RolloutRecord(rid, rollout["status"], [], [], 0, "",
                                 f"rollout {rollout['status']}, attempt {attempt.get('status', 'never started')}")
        spans = await self._request("GET", "/spans", params={"rollout_id": rid, "attempt_id": aid, "limit": -1})
        reward, _count = final_reward(spans.get("items", ()))
        calls = await self._calls(rid, aid)
        return RolloutRecord(rid, "succeeded", calls, [] if reward is None else [reward], 0, "")

    async def _wait(self, rid: str) -> dict[str, Any]:
        s = self.settings
        deadline = time.monotonic() + s.timeout_s + s.wait_margin_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                rollout = await self._request("GET", f"/rollouts/{rid}")
                raise RolloutFailed(f"rollout {rid}: still {rollout.get('status')!r} after "
                                    f"{s.timeout_s + s.wait_margin_s:.0f} s (agent_lightning.timeout_s + wait_margin_s);"
                                    " are the Trainer's runners alive?")
            try:
                done = await self._request("POST", "/waits/rollouts", json={"rollout_ids": [rid], "timeout": min(left, 10.0)},
                                           timeout=min(left, 10.0) + 30)
            except RolloutFailed as exc:
                # a busy store can hold a long-poll past its own timeout: not an answer, ask again until the deadline
                if not isinstance(exc.__cause__, httpx.TimeoutException):
                    raise
                log.info("rollout %s: the store's wait did not answer in time (%s); waiting again", rid, exc)
                continue
            if any(r.get("rollout_id") == rid and r.get("status") in FINISHED for r in done):
                # the attempt (its id, for the spans and the ingress's session) comes with the single-rollout view
                return await self._request("GET", f"/rollouts/{rid}")

    async def _calls(self, rid: str, aid: str) -> list[SessionCall]:
        session = agl_session_id(rid, aid)
        try:
            response = await self._ingress.get(f"/v1/sessions/{session}")
        except httpx.HTTPError as exc:
            raise RolloutFailed(f"rollout {rid}: reading its calls from the ingress: {type(exc).__name__}: {exc}") from exc
        if response.status_code == 404:
            return []  # the agent made no call through main_llm's base URL
        if response.status_code >= 400:
            raise RolloutFailed(f"rollout {rid}: the ingress answered {response.status_code} for session {session}: "
                                f"{response.text[:300]}")
        return [SessionCall.from_json(c, f"rollout {rid} call {i}") for i, c in enumerate(response.json()["calls"])]

    async def _cancel(self, rid: str) -> None:
        try:
            await self._request("POST", f"/rollouts/{rid}", json={"status": "cancelled"})
        except RolloutFailed as exc:  # already finished, or the store is gone: nothing left to mark
            log.info("rollout %s not cancelled: %s", rid, exc)

    async def close(self) -> None:
        await self._store.aclose()
        await self._ingress.aclose()
