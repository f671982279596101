"""Typed records passed between layers (agents layer: pure, no ray/torch).

One record per hop of the data flow in DESIGN.md. Every record checks its invariants when it is
built, so a malformed value fails where it was made, not three hops later.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class ToolCall:
    """One decoded tool call. ``arguments`` is always a dict (decoded JSON object)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"ToolCall.name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.arguments, dict):
            raise ValueError(
                f"ToolCall {self.name!r}: arguments must be a dict, got {type(self.arguments).__name__}"
            )


@dataclass(frozen=True)
class ParsedToolCalls:
    """What a tool-call parser found in one model output.

    ``content`` is the text with the call blocks removed; ``errors`` has one message per block
    that looked like a call but could not be decoded (malformed output is data, not an exception).
    """

    calls: list[ToolCall] = field(default_factory=list)
    content: str = ""
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ToolResult:
    """What running one tool call produced; ``error`` is None on success."""

    name: str
    content: str
    error: str | None = None
    latency_s: float = 0.0
    call_id: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one generate call. ``top_k <= 0`` disables top-k."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    json_schema: str | None = None
    """A JSON schema (as JSON text) the output must match: constrained decoding, which only the vllm engine does
    (vLLM's structured output); ``HFEngine`` refuses such a request."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))


@dataclass(frozen=True)
class GenerateRequest:
    """Token-in request to a rollout server. ``trajectory_id`` keys sticky routing."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    trajectory_id: str = ""
    request_id: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", tuple(int(t) for t in self.prompt_ids))
        if not self.prompt_ids:
            raise ValueError(f"request {self.request_id or self.trajectory_id!r}: empty prompt_ids")


@dataclass(frozen=True)
class GenerateResult:
    """Token-out answer: the sampled ids, their log-probs and the adapter version that sampled them."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    policy_version: int
    replica_id: str = ""
    token_versions: tuple[int, ...] = ()
    """The adapter version that sampled each token, when the engine records it (else every token has
    ``policy_version``); a partial rollout interrupted by a weight sync has several."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_ids", tuple(int(t) for t in self.token_ids))
        object.__setattr__(self, "logprobs", tuple(float(x) for x in self.logprobs))
        object.__setattr__(self, "token_versions", tuple(int(v) for v in self.token_versions))
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"GenerateResult: {len(self.token_ids)} token_ids but {len(self.logprobs)} logprobs"
            )
        if self.token_versions and len(self.token_versions) != len(self.token_ids):
            raise ValueError(
                f"GenerateResult: {len(self.token_ids)} token_ids but {len(self.token_versions)} token_versions"
            )
        if self.finish_reason not in ("stop", "length", "abort"):
            raise ValueError(f"GenerateResult: unknown finish_reason {self.finish_reason!r}")


@dataclass(frozen=True)
class AdapterRef:
    """A LoRA adapter published by the trainer: a peft adapter folder and the policy version it makes.

    A replica on the node that wrote ``path`` (``node_id``) loads it from there; a replica on any other node loads
    the same files from ``files``, a Ray object reference to ``{file name: bytes}`` of the folder that the trainer
    puts in the object store, so a cluster needs no shared filesystem for weight syncs.
    Version 0 is the run's starting policy: the base model (``path`` empty) or, when the run starts from a
    saved adapter (``actor_rollout_ref.model.lora_adapter_path``), that adapter.
    """

    version: int
    path: str = ""
    base_model: str = ""
    # the training step whose update made it (None: not from a step). Equal to ``version`` until a learner
    # restarts from a checkpoint: versions keep increasing, the step goes back to the checkpoint's
    step: int | None = None
    # ObjectRef[dict[str, bytes]] of the adapter folder's files (None: ``path`` only); not part of equality
    files: Any = field(default=None, compare=False, repr=False)
    # the Ray node whose disk holds ``path`` ("" = unknown: any node that can read ``path`` loads it from there)
    node_id: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.version < 0:
            raise ValueError(f"AdapterRef.version must be >= 0, got {self.version}")
        if self.version > 0 and not self.path:
            raise ValueError(f"AdapterRef version {self.version} has no path")


class Termination(str, enum.Enum):
    """Why an episode ended."""

    ANSWERED = "answered"  # the model answered without calling a tool
    EOS = "eos"  # single-turn: generation stopped at EOS / stop token
    MAX_ASSISTANT_TURNS = "max_assistant_turns"
    MAX_USER_TURNS = "max_user_turns"
    RESPONSE_BUDGET = "response_budget"  # data.max_response_length used up
    MAX_MODEL_LEN = "max_model_len"
    PARSE_ERROR = "parse_error"  # multi_turn.on_parse_error=stop
    ENGINE_ABORT = "engine_abort"
    FAILED = "failed"  # validation: the episode raised (a scored sample of 0, counted; training fails its group)


@dataclass(frozen=True)
class Trajectory:
    """One sampled episode, token-exact, ready for training.

    ``response_mask`` is 1 for tokens sampled by the policy and 0 for tool/user tokens;
    ``rollout_logprobs`` has one entry per response token (0.0 where the mask is 0).
    ``policy_version`` is the oldest adapter version that sampled any of its tokens.
    """

    trajectory_id: str
    group_id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_mask: tuple[int, ...]
    rollout_logprobs: tuple[float, ...]
    reward: float
    policy_version: int
    agent_name: str = "single_turn_agent"
    termination: Termination = Termination.EOS
    num_turns: int = 1
    num_tool_calls: int = 0
    num_tool_errors: int = 0
    num_parse_errors: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    reward_extra: dict[str, float] = field(default_factory=dict)
    """The reward function's numbers besides the score (verl's ``reward_extra_info``, e.g. ``acc``)."""
    token_versions: tuple[int, ...] = ()
    """The adapter version that sampled each response token (-1 on tool/user tokens); empty when the engine
    does not record it (then every policy token counts as ``policy_version``)."""

    def __post_init__(self) -> None:
        for name in ("prompt_ids", "response_ids", "response_mask"):
            object.__setattr__(self, name, tuple(int(t) for t in getattr(self, name)))
        object.__setattr__(self, "rollout_logprobs", tuple(float(x) for x in self.rollout_logprobs))
        where = f"trajectory {self.trajectory_id!r}"
        n = len(self.response_ids)
        if len(self.response_mask) != n:
            raise ValueError(f"{where}: {n} response_ids but {len(self.response_mask)} mask entries")
        if len(self.rollout_logprobs) != n:
            raise ValueError(f"{where}: {n} response_ids but {len(self.rollout_logprobs)} rollout_logprobs")
        if any(m not in (0, 1) for m in self.response_mask):
            raise ValueError(f"{where}: response_mask must hold only 0 and 1")
        if not self.prompt_ids:
            raise ValueError(f"{where}: empty prompt_ids")
        if not math.isfinite(self.reward):
            raise ValueError(f"{where}: reward must be finite, got {self.reward}")
        bad = {k: v for k, v in self.reward_extra.items() if not math.isfinite(v)}
        if bad:
            raise ValueError(f"{where}: reward_extra values must be finite, got {bad}")
        if self.policy_version < 0:
            raise ValueError(f"{where}: policy_version must be >= 0")
        object.__setattr__(self, "token_versions", tuple(int(v) for v in self.token_versions))
        if self.token_versions and len(self.token_versions) != n:
            raise ValueError(f"{where}: {n} response_ids but {len(self.token_versions)} token_versions")
        object.__setattr__(self, "termination", Termination(self.termination))

    @property
    def num_policy_tokens(self) -> int:
        return sum(self.response_mask)

    def policy_token_versions(self) -> list[int]:
        """The sampling version of each policy token (``policy_version`` for all when not recorded)."""
        if not self.token_versions:
            return [self.policy_version] * self.num_policy_tokens
        return [v for v, m in zip(self.token_versions, self.response_mask) if m]


@dataclass(frozen=True)
class ScoredSample:
    """One finished episode as verl's validation metrics and generation dumps see it: decoded text, not tokens.

    ``uid`` is the row's group id (the n samples of one prompt share it); ``reward_extra`` holds the reward
    function's other numbers (``acc``, ...).
    """

    data_source: str
    uid: str
    input: str
    output: str
    score: float
    ground_truth: Any = None
    reward_extra: dict[str, float] = field(default_factory=dict)
    num_turns: int = 1
    num_tool_calls: int = 0
    num_tool_errors: int = 0  # tool calls whose result was an error fed back to the model (SQL errors included)
    num_parse_errors: int = 0  # tool calls the parser could not read
    response_length: int = 0  # tokens the model generated (tool results not counted)
    termination: str = ""  # a Termination value: why the episode ended
