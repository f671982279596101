"""``agent_lightning``: episodes run by an unchanged Agent Lightning 1.x agent, driven over HTTP
(agents layer: asyncio + httpx; no ray, and no ``agentlightning`` import: it needs Python >= 3.12 and lives
in its own environment). Agent Lightning 0.3.x's store is the other client of the same loop
(``agents.loops.agent_lightning_store``).

Agent Lightning 1.x splits a training system into ``agl-server`` (a rollout store plus an OpenAI proxy
that records every LLM call with its token ids and log-probs) and ``agl-controller`` (runs the user's
agent class as a process per rollout). Its own trainer (``agentlightning.verl``) is what tandem-rl
replaces. One episode here is one Agent Lightning rollout:

1. the rollout app's OpenAI ingress is registered as the server's model (``POST /api/models``, under
   ``agent_lightning.model_name`` with the newest policy version seen so far; re-registered when a newer
   version answers, i.e. after each publish reaches the replicas);
2. ``POST /api/rollouts`` creates the rollout (input: the row, ``config.local``: agent class, env map,
   timeout); the controller starts the agent, whose LLM calls go through the server's proxy to the ingress;
3. the rollout's state is polled until ``succeeded`` or ``failed``; a failed or timed-out rollout raises
   ``RolloutFailed`` (its group is counted failed by the coordinator: nothing is silently dropped);
4. its events are read raw (``GET /api/rollouts/{id}/events``): each ``model_request`` holds the ingress's
   full response (``prompt_token_ids``, ``choices[0].token_ids``, per-token log-probs, the policy version in
   ``system_fingerprint``). The proxy forwards no session header, so the calls are joined token-exactly from
   those ids alone (``merge_session_calls``: a call whose prompt extends the previous prompt + response
   joins it, anything else starts a new sample). The raw view is read rather than ``format=triplet``
   because the triplet view drops the policy version that actually answered and keeps only the last of
   calls with equal prompts;
5. the reward is the value of the agent's last ``reward`` event (as Agent Lightning's own trainer takes
   it); a rollout that succeeded without one scores 0 and is counted (``agl_missing_reward``), or fails
   its group with ``missing_reward=error``.

What does not carry over: the proxy overrides ``temperature`` (its ``default_proxy.train``/``val``
settings, not ``rollout.temperature`` / ``val_kwargs``) and does not stream; the agent picks its own
``max_tokens`` (the ingress bounds each call by ``max_model_len``), so a response longer than
``data.max_response_length`` is cut there for training.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from agents.loops.base import AgentContext, EpisodeResult
from agents.data.truncation import apply_prompt_limit
from agents.loops.episode import Episode, LoopLimits
from agents.loops.session_merge import MergedSample, SessionCall, merge_session_calls
from agents.records import Termination, Trajectory

log = logging.getLogger("tandem_rl.agents")

TERMINAL = ("succeeded", "failed")
_VERSION = re.compile(r"policy-v(\d+)")


class RolloutFailed(RuntimeError):
    """An Agent Lightning rollout ended ``failed`` (agent error, timeout) or never reached a terminal state."""


@dataclass(frozen=True)
class AglSettings:
    """The ``agent_lightning`` config section, as the loop reads it."""

    server_url: str = ""
    agent_class: str = ""
    store_url: str = ""  # Agent Lightning 0.3.x's store instead of a 1.x agl-server (agents.loops.agent_lightning_store)
    model_name: str = "tandem"
    api_key: str = ""
    env_map: Mapping[str, str] = field(default_factory=dict)
    input_fields: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    wait_margin_s: float = 60.0
    poll_interval_s: float = 0.5
    missing_reward: str = "zero"
    keep_rollouts: bool = False

    @classmethod
    def from_config(cls, section: Any) -> AglSettings | None:
        """From ``cfg.agent_lightning`` (None when neither a 1.x server nor a 0.3.x store is configured); the key is
        read from its env var."""
        if section.store_url:
            return cls(store_url=section.store_url.rstrip("/"), input_fields=dict(section.input_fields),
                       timeout_s=section.timeout_s, wait_margin_s=section.wait_margin_s,
                       poll_interval_s=section.poll_interval_s, missing_reward=section.missing_reward)
        if not section.server_url or not section.agent_class:
            return None
        key = ""
        if section.api_key_env:
            key = os.environ.get(section.api_key_env, "")
            if not key:
                raise ValueError(f"agent_lightning.api_key_env={section.api_key_env!r}: that environment variable "
                                 "is not set")
        return cls(server_url=section.server_url.rstrip("/"), agent_class=section.agent_class,
                   model_name=section.model_name, api_key=key, env_map=dict(section.env_map),
                   input_fields=dict(section.input_fields), timeout_s=section.timeout_s,
                   wait_margin_s=section.wait_margin_s, poll_interval_s=section.poll_interval_s,
                   missing_reward=section.missing_reward, keep_rollouts=section.keep_rollouts)


def _resolve(root: Any, path: str, where: str) -> Any:
    value = root
    for part in path.split("."):
        try:
            value = value[int(part)] if isinstance(value, (list, tuple)) else value[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise ValueError(f"{where}: agent_lightning.input_fields path {path!r} does not resolve at {part!r}") from None
    return value


def rollout_input(episode: Episode, fields: Mapping[str, str]) -> dict[str, Any]:
    """The rollout's ``input``: the row (``data_id``, ``messages``, ``ground_truth``, ``data_source``, its
    ``extra_info`` keys) plus each ``input_fields`` entry resolved against it."""
    extra = {k: v for k, v in episode.extra_info.items() if k not in ("tools_kwargs", "interaction_kwargs")}
    root = {"messages": [dict(m) for m in episode.messages], "ground_truth": episode.ground_truth,
            "data_source": episode.data_source, "extra_info": extra}
    data = {**extra, **root, "data_id": str(extra.get("index", episode.group_id))}
    data.pop("extra_info")
    where = f"row {extra.get('index', episode.group_id)!r}"
    for name, path in fields.items():
        data[name] = _resolve(root, path, where)
    return data


def call_from_event(data: Mapping[str, Any], where: str, *, need_logprobs: bool) -> SessionCall:
    """One recorded ``model_request`` as a ``SessionCall`` (chat or completions response of the ingress)."""
    response = data.get("response") or {}
    try:
        choice = response["choices"][0]
        prompt = response.get("prompt_token_ids") or choice.get("prompt_token_ids")
        ids = choice["token_ids"]
        if prompt is None or ids is None:
            raise KeyError("prompt_token_ids / token_ids")
        logprobs_obj = choice.get("logprobs") or {}
        if "content" in logprobs_obj:
            logprobs = [c["logprob"] for c in logprobs_obj["content"] or ()]
        else:
            logprobs = list(logprobs_obj.get("token_logprobs") or ())
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"{where}: the recorded response has no token ids ({type(exc).__name__}: {exc}); the "
                         "proxy must reach tandem-rl's ingress, which returns them") from None
    if not logprobs and not need_logprobs:
        logprobs = [0.0] * len(ids)  # validation calls: the proxy asks for no log-probs in val mode
    match = _VERSION.search(str(response.get("system_fingerprint", "")))
    return SessionCall.from_json(
        {"prompt_ids": prompt, "response_ids": ids, "logprobs": logprobs,
         "policy_version": int(match.group(1)) if match else 0, "finish_reason": choice.get("finish_reason") or "stop"},
        where)


@dataclass
class RolloutRecord:
    """What one finished rollout left on the server, decoded."""

    rollout_id: str
    state: str
    calls: list[SessionCall]
    rewards: list[float]
    llm_errors: int
    answer: str
    error: str = ""


async def agl_request(client: httpx.AsyncClient, who: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One request to an Agent Lightning server; a transport error or an answer >= 400 raises ``RolloutFailed``
    naming ``who``, the method and the path."""
    try:
        response = await client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise RolloutFailed(f"{who}: {method} {path}: {type(exc).__name__}: {exc}") from exc
    if response.status_code >= 400:
        raise RolloutFailed(f"{who}: {method} {path} answered {response.status_code}: {response.text[:300]}")
    return response


class AglClient:
    """One agent worker's connection to ``agl-server``."""

    def __init__(self, settings: AglSettings, openai_base_url: str):
        if not openai_base_url:
            raise ValueError("the agent_lightning loop needs the rollout app's OpenAI URL (AgentContext.openai_base_url)")
        self.settings = settings
        self.endpoint = f"{openai_base_url.rstrip('/')}/v1"
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        self._client = httpx.AsyncClient(base_url=settings.server_url, headers=headers, timeout=30.0)
        self._registered: int | None = None
        self._register_lock = asyncio.Lock()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return await agl_request(self._client, f"agl-server {self.settings.server_url}", method, path, **kwargs)

    async def register(self, version: int) -> None:
        """Register (upsert) the ingress as ``model_name`` at ``version`` unless a newer one is registered."""
        async with self._register_lock:
            if self._registered is not None and version <= self._registered:
                return
            body = [{"model": self.settings.model_name, "endpoint": self.endpoint, "version": version}]
            await self._request("POST", "/api/models", json=body)
            self._registered = version

    async def run(self, episode: Episode, *, is_train: bool) -> RolloutRecord:
        """Create the episode's rollout, wait for it, read and (by default) delete it."""
        s = self.settings
        await self.register(self._registered or 0)
        rid = f"{episode.trajectory_id}-{uuid.uuid4().hex[:6]}"
        body = [{"rollout_id": rid, "input": rollout_input(episode, s.input_fields), "is_train": is_train,
                 "config": {"timeout_seconds": s.timeout_s,
                            "local": {"agent_class": s.agent_class, "env_map": dict(s.env_map)}},
                 "metadata": {"group_id": episode.group_id, "sample_index": episode.sample_index,
                              "admitted_at_version": episode.step, "validation": episode.validation}}]
        await self._request("POST", "/api/rollouts", json=body)
        try:
            rollout = await self._wait(rid)
            events = (await self._request("GET", f"/api/rollouts/{rid}/events")).json()
        except asyncio.CancelledError:  # the run abandoned the group: say so on the server, where the rollout shows
            await asyncio.shield(self._abandon(rid))
            raise
        finally:
            if not s.keep_rollouts:
                try:
                    await self._request("DELETE", f"/api/rollouts/{rid}")
                except RolloutFailed as exc:
                    log.warning("could not delete rollout %s: %s", rid, exc)
        record = self._record(rid, rollout, events, need_logprobs=is_train)
        newest = max((c.policy_version for c in record.calls), default=0)
        if newest > (self._registered or 0):
            await self.register(newest)
        return record

    async def _abandon(self, rid: str) -> None:
        try:
            await self._request("PATCH", f"/api/rollouts/{rid}", json={"status": {
                "state": "failed", "error_message": "abandoned by tandem-rl: the run no longer needs this group"}})
        except RolloutFailed as exc:  # already terminal (409) or the server is gone: nothing left to mark
            log.info("rollout %s not marked abandoned: %s", rid, exc)

    async def _wait(self, rid: str) -> dict[str, Any]:
        s = self.settings
        deadline = time.monotonic() + s.timeout_s + s.wait_margin_s
        while True:
            rollout = (await self._request("GET", f"/api/rollouts/{rid}")).json()["rollout"]
            if rollout["status"]["state"] in TERMINAL:
                return rollout
            if time.monotonic() > deadline:
                raise RolloutFailed(f"rollout {rid}: still {rollout['status']['state']!r} after "
                                    f"{s.timeout_s + s.wait_margin_s:.0f} s (agent_lightning.timeout_s + wait_margin_s);"
                                    " is agl-controller running against this server?")
            await asyncio.sleep(s.poll_interval_s)

    def _record(self, rid: str, rollout: Mapping[str, Any], events: Sequence[Mapping[str, Any]], *,
                need_logprobs: bool) -> RolloutRecord:
        calls: list[SessionCall] = []
        rewards: list[float] = []
        errors = 0
        answer = ""
        for i, event in enumerate(events):
            data = event.get("data") or {}
            if event.get("event_type") == "model_request":
                if data.get("status") != "ok" or int(data.get("http_status") or 200) >= 400:
                    errors += 1
                    continue
                calls.append(call_from_event(data, f"rollout {rid} event {i}", need_logprobs=need_logprobs))
                choice = data["response"]["choices"][0]
                answer = str((choice.get("message") or {}).get("content") or choice.get("text") or "")
            elif event.get("event_type") == "reward":
                try:
                    rewards.append(float(data["value"]))
                except (KeyError, TypeError, ValueError):
                    raise ValueError(f"rollout {rid} event {i}: a reward event needs a numeric data.value, got "
                                     f"{data!r}") from None
        status = rollout["status"]
        return RolloutRecord(rid, status["state"], calls, rewards, errors, answer, status.get("error_message") or "")

    async def close(self) -> None:
        await self._client.aclose()


def _trajectory(episode: Episode, sample: MergedSample, index: int, reward: float, record: RolloutRecord,
                missing_reward: bool, limits: LoopLimits) -> Trajectory:
    """One merged sample as a trajectory, within tandem-rl's limits: the agent chose its own ``max_tokens``, so a
    response over ``data.max_response_length`` is cut there (as verl cuts an agent loop's output; the kept tokens'
    log-probs stay exact, and the reward is the agent's, for the whole answer) and a prompt over
    ``data.max_prompt_length`` follows ``data.truncation`` (``error``, the default, fails the group naming the row)."""
    where = f"trajectory {episode.trajectory_id!r} (Agent Lightning rollout {record.rollout_id})"
    prompt = list(sample.prompt_ids)
    if limits.max_prompt_length is not None and len(prompt) > limits.max_prompt_length:
        prompt = apply_prompt_limit(prompt, limits.max_prompt_length, limits.truncation,
                                    episode.extra_info.get("index", where))
    termination = Termination.RESPONSE_BUDGET if sample.last_finish_reason == "length" else Termination.ANSWERED
    keep = len(sample.response_ids)
    if keep > limits.max_response_length:
        keep, termination = limits.max_response_length, Termination.RESPONSE_BUDGET
    return Trajectory(
        trajectory_id=episode.trajectory_id if index == 0 else f"{episode.trajectory_id}/part{index}",
        group_id=episode.group_id,
        prompt_ids=tuple(prompt),
        response_ids=tuple(sample.response_ids[:keep]),
        response_mask=tuple(sample.response_mask[:keep]),
        rollout_logprobs=tuple(sample.logprobs[:keep]),
        reward=reward,
        policy_version=sample.policy_version,
        agent_name="agent_lightning",
        termination=termination,
        num_turns=sample.num_calls,
        metrics={"num_llm_calls": float(sample.num_calls), "agl_llm_errors": float(record.llm_errors),
                 "agl_missing_reward": float(missing_reward), "agl_response_cut": float(keep < len(sample.response_ids))},
    )


async def run_agent_lightning(ctx: AgentContext, episode: Episode) -> EpisodeResult:
    """One Agent Lightning rollout as one episode (trajectories joined from its recorded calls)."""
    client = ctx.agent_lightning
    if client is None:
        raise ValueError(f"trajectory {episode.trajectory_id!r}: agent_name agent_lightning needs the "
                         "agent_lightning config section (server_url and agent_class for 1.x, store_url for 0.3.x)")
    record = await client.run(episode, is_train=not episode.validation)
    where = f"trajectory {episode.trajectory_id!r} (Agent Lightning rollout {record.rollout_id})"
    if record.state != "succeeded":
        raise RolloutFailed(f"{where} failed: {record.error or 'no error message'}")
    if not record.calls:
        raise RolloutFailed(f"{where}: the agent made no successful LLM call ({record.llm_errors} failed)")
    missing = not record.rewards
    if missing and client.settings.missing_reward == "error":
        raise RolloutFailed(f"{where}: the agent posted no reward event (agent_lightning.missing_reward=error)")
    reward = record.rewards[-1] if record.rewards else 0.0
    samples = merge_session_calls(record.calls)
    trajectories = [_trajectory(episode, s, i, reward, record, missing, ctx.limits) for i, s in enumerate(samples)]
    conversation = (*[dict(m) for m in episode.messages], {"role": "assistant", "content": record.answer})
    return EpisodeResult(trajectories[0], conversation, tuple(trajectories[1:]))
