"""vLLM engine behind the ``Engine`` interface (deployments layer; the GPU engine).

Wraps vLLM's async engine (``AsyncLLM`` via ``AsyncLLMEngine.from_engine_args``): vLLM does the
continuous batching, this class translates records. Tokens in (``TokensPrompt``), tokens out, with the
log-prob of each sampled token (``SamplingParams.logprobs=0``) under vLLM's default
``logprobs_mode="raw_logprobs"``, i.e. the raw model distribution before temperature / top-k / top-p:
the same quantity ``HFEngine`` reports.

LoRA: adapters are ``LoRARequest(name, lora_int_id, path)`` with a fresh id per load: vLLM caches an
adapter by its id, so reusing a version's id (a new run after a registry reset publishes version 1 again,
and version 0 may be a saved adapter) would keep sampling the old weights. A request keeps the adapter it
was submitted with, so in-flight requests finish on the old version while new ones start on the new
one; each output reports the version it was submitted under. A swap therefore never waits for running
generations (``swaps_while_generating``: ``RolloutServer`` skips its drain), and every token of an
output still comes from one adapter. Old adapters are not removed explicitly:
vLLM evicts the least recently used ones (``max_loras`` / ``max_cpu_loras``).

Every vllm import is inside a function, so importing this module (or ``deployments.engines``) never
imports vllm; only constructing a ``VLLMEngine`` does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agents.records import AdapterRef, FinishReason, SamplingParams
from deployments.engines.base import EngineOutput, PromptTooLong

# Options of vLLM's OpenAI server, not of the engine: kept out of the engine args and exposed as
# ``VLLMEngine.server_options`` for the ingress that renders chats and parses tool calls.
SERVER_ONLY_OPTIONS = frozenset(
    {"enable_auto_tool_choice", "tool_call_parser", "tool_parser_plugin", "chat_template", "reasoning_parser"}
)
FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def split_vllm_kwargs(vllm_kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``engine_kwargs.vllm`` -> (engine args, OpenAI-server options)."""
    engine = {k: v for k, v in vllm_kwargs.items() if k not in SERVER_ONLY_OPTIONS}
    server = {k: v for k, v in vllm_kwargs.items() if k in SERVER_ONLY_OPTIONS}
    return engine, server


def to_vllm_sampling(sampling: SamplingParams) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one request (token ids out, no text)."""
    return {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": max(0, sampling.top_k),  # vLLM: 0 disables top-k
        "max_tokens": sampling.max_new_tokens,
        "stop_token_ids": list(sampling.stop_token_ids),
        "seed": sampling.seed,
        "logprobs": 0,  # only the sampled token's log-prob
        "detokenize": False,
        **structured_output(sampling.json_schema),
    }


def structured_output(json_schema: str | None) -> dict[str, Any]:
    """``vllm.SamplingParams`` keyword arguments that constrain the output to a JSON schema (none without one)."""
    if json_schema is None:
        return {}
    from vllm.sampling_params import StructuredOutputsParams

    return {"structured_outputs": StructuredOutputsParams(json=json.loads(json_schema))}


class VLLMEngine:
    """``Engine`` over vLLM's ``AsyncLLM`` with LoRA enabled."""

    # Read by RolloutServer: vLLM keeps each request's LoRA, so a swap need not wait for running generates.
    swaps_while_generating = True

    def __init__(
        self,
        model_path: str,
        *,
        max_model_len: int | None = None,
        max_lora_rank: int = 64,
        max_loras: int = 2,
        vllm: Mapping[str, Any] | None = None,
        ignore_eos: bool = False,
    ) -> None:
        """``ignore_eos``: generate ``max_new_tokens`` whatever is sampled (benchmarks; ``HFEngine(eos_token_ids=())``
        does the same), stop ids still stop."""
        from vllm import AsyncEngineArgs, AsyncLLMEngine

        engine_kwargs, self.server_options = split_vllm_kwargs(vllm or {})
        if max_model_len is not None:
            engine_kwargs.setdefault("max_model_len", max_model_len)
        engine_kwargs.setdefault("enable_lora", True)
        engine_kwargs.setdefault("max_lora_rank", max_lora_rank)
        engine_kwargs.setdefault("max_loras", max_loras)
        self.model_path = model_path
        self.ignore_eos = ignore_eos
        self.engine_args = AsyncEngineArgs(model=model_path, **engine_kwargs)
        self._engine = AsyncLLMEngine.from_engine_args(self.engine_args)
        self.max_model_len = int(self._engine.model_config.max_model_len)
        self.version = 0
        self._lora_request = None
        self._loads = 0  # LoRA ids handed out (vLLM needs ids >= 1, unique per adapter)

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, request_id: str) -> EngineOutput:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError(f"request {request_id!r}: empty prompt_ids")
        if len(prompt) >= self.max_model_len:
            raise PromptTooLong(
                f"request {request_id!r}: prompt has {len(prompt)} tokens, max_model_len is {self.max_model_len} "
                "(the prompt must leave room for at least one new token)"
            )
        params = VLLMSamplingParams(**to_vllm_sampling(sampling), ignore_eos=self.ignore_eos,
                                    output_kind=RequestOutputKind.FINAL_ONLY)
        version, lora_request = self.version, self._lora_request
        final = None
        async for output in self._engine.generate(
            TokensPrompt(prompt_token_ids=prompt), params, request_id, lora_request=lora_request
        ):
            final = output
        if final is None or not final.outputs:
            raise RuntimeError(f"request {request_id!r}: vLLM returned no output")
        completion = final.outputs[0]
        token_ids = tuple(int(t) for t in completion.token_ids)
        # completion.logprobs: one {token_id: Logprob} per sampled position
        logprobs = tuple(float(step[t].logprob) for t, step in zip(token_ids, completion.logprobs or ()))
        if len(logprobs) != len(token_ids):
            raise RuntimeError(f"request {request_id!r}: {len(token_ids)} tokens but {len(logprobs)} logprobs")
        return EngineOutput(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=FINISH_REASONS.get(str(completion.finish_reason), "abort"),
            policy_version=version,
            token_versions=(version,) * len(token_ids),
        )

    async def load_adapter(self, ref: AdapterRef) -> None:
        """New requests sample with ``ref`` (version 0 without a path = the base model; version 0 with a
        path = the saved adapter the run starts from); the adapter is loaded before returning."""
        from vllm.lora.request import LoRARequest

        if not ref.path:  # version 0, base model (AdapterRef: a version > 0 always has a path)
            self._lora_request, self.version = None, 0
            return
        self._loads += 1
        request = LoRARequest(lora_name=f"policy_v{ref.version}_{self._loads}", lora_int_id=self._loads,
                              lora_path=ref.path)
        # add_lora loads it now, so a bad adapter fails here and not on the next generate
        await self._engine.add_lora(request)
        self._lora_request, self.version = request, ref.version

    async def close(self) -> None:
        self._engine.shutdown()
        # drop the reference now: AsyncLLM.__del__ shuts down again, and fails if it runs at interpreter exit
        self._engine = None
