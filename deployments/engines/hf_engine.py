"""Transformers engine with step-level batching (deployments layer; the CPU default engine).

Why not transformers' own continuous batching (``generate_batch`` / ``init_continuous_batching`` in
transformers 5.10): it runs on CPU, but ``do_sample`` is one global switch (greedy and sampled
requests cannot share a batch), there is one RNG for all requests (no per-request seed), and on the
tiny CPU model it was slower than plain one-at-a-time ``model.generate`` (56 vs 111 tokens/s for 16
requests x 32 tokens) and 3-40x slower than this engine (``benchmarks/engine_batching.py`` prints both).
So this engine batches at the step level itself (sampling and cache bookkeeping: ``hf_batch``):

- One asyncio task owns the running batch; every model call runs in a worker thread
  (``asyncio.to_thread``) so the event loop stays responsive.
- Between decode steps it admits waiting requests and prefills them (``hf_prefill``): in forwards of at most
  ``PREFILL_TOKENS`` tokens, each prompt after the longest stored sequence it starts with, identical prompts (a
  GRPO group's n samples) once. The new rows are then merged into the running batch's ``DynamicCache``: rows are
  right-aligned, shorter rows left-padded with zero keys and values that the attention mask hides. Finished rows
  are dropped and all-padding columns trimmed.
- Stored sequences (``PrefixCache``): the common prefix of consecutive prompts (an agent's system prompt with its
  tool schemas) and, when a request finishes, its row's whole sequence, so an episode's next turn forwards only
  the new tokens (``stats``: ``prefill_tokens_cached``; a multi-turn agent benchmark forwards 31k instead of 132k
  prompt tokens, ``benchmarks/rollout_async.py``). Bounded by ``prefix_cache_mib`` of keys and values, least
  recently used out; cleared on every adapter change. The rest is forwarded against cached keys instead of the
  whole prompt at once, so log-probs may differ from the one-pass forward in the last float bits
  (``prefix_cache_min_tokens=0`` turns it off).
- Each row samples with its own temperature / top-k / top-p and its own ``torch.Generator`` (seeded
  from ``SamplingParams.seed``), so a seeded request is reproducible whatever it is batched with.
- Log-probs are those of the sampled tokens under the raw model distribution (``log_softmax`` of the
  logits, before temperature, top-k and top-p): the quantity the trainer recomputes for the policy at
  temperature 1, and vLLM's default (``raw_logprobs``), so both engines report the same thing.
- LoRA swaps, two modes (``swap``):
  ``drain`` (default): once ``load_adapter`` is called no new request is admitted, the swap happens
  when the running batch is empty, then admission resumes; every output was produced by exactly one
  adapter version. ``interrupt`` (partial rollouts, for streaming RL): the swap happens between two
  decode steps; the running rows' KV cache is recomputed with the new weights and decoding goes on,
  so a weight sync never waits for a long generation. An output's tokens may then come from several
  versions; each token's log-prob is the one of the adapter that sampled it (the behaviour policy the
  trainer's importance ratio needs), and ``EngineOutput.policy_version`` is the oldest of them, so
  staleness bounds stay conservative.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Literal, Sequence, get_args

import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicLayer

from agents.records import AdapterRef, SamplingParams
from deployments.engines.base import EngineOutput, PromptTooLong
from deployments.engines.hf_attention import ATTENTION
from deployments.engines.hf_batch import RequestState, RunningBatch, keep_rows, merge_batches, sample_next
from deployments.engines.hf_linear import can_pack, pack_linears
from deployments.engines.hf_prefill import PrefixCache, Prefiller

DType = Literal["float32", "bfloat16", "float16"]
SwapMode = Literal["drain", "interrupt"]
DTYPES: dict[DType, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


class HFEngine:
    """Step-level batched generation with a transformers causal LM (see the module docstring).

    ``max_batch_size`` caps the rows decoding together (more requests wait for a free row);
    ``eos_token_ids`` defaults to the model's generation config; ``num_threads`` sets torch's intra-op
    threads (None keeps the process setting, which Ray derives from the replica's ``num_cpus``: more
    threads than free cores makes batched matmuls wait on descheduled threads); ``swap`` is how
    ``load_adapter`` treats running requests (see the module docstring); the default attention is
    ``sdpa`` without copying the KV cache for grouped-query heads (``hf_attention``); sequences of at least
    ``prefix_cache_min_tokens`` tokens are kept for reuse, up to ``prefix_cache_mib`` MiB of keys and values
    (0 turns either off; see the module docstring); ``pack_weights`` (float32 on the CPU) multiplies with weights
    packed once for oneDNN (``hf_linear``) instead of plain ``nn.Linear``.
    """

    def __init__(
        self,
        model_path: str,
        *,
        max_model_len: int,
        dtype: DType = "float32",
        device: str = "cpu",
        max_batch_size: int = 32,
        eos_token_ids: Sequence[int] | None = None,
        num_threads: int | None = None,
        attn_implementation: str = ATTENTION,
        swap: SwapMode = "drain",
        prefix_cache_min_tokens: int = 32,
        prefix_cache_mib: float = 512,
        pack_weights: bool = True,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"HFEngine({model_path!r}): max_batch_size must be >= 1, got {max_batch_size}")
        if prefix_cache_mib < 0:
            raise ValueError(f"HFEngine({model_path!r}): prefix_cache_mib must be >= 0, got {prefix_cache_mib}")
        if swap not in get_args(SwapMode):
            raise ValueError(f"HFEngine({model_path!r}): swap must be one of {get_args(SwapMode)}, got {swap!r}")
        self.swap = swap
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.model_path = model_path
        self.max_model_len = max_model_len
        self.max_batch_size = max_batch_size
        self.device = torch.device(device)
        self._model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=DTYPES[dtype], attn_implementation=attn_implementation
        ).to(self.device)
        self._model.eval()
        self.packed_linears = pack_linears(self._model) if pack_weights and can_pack(self.device, DTYPES[dtype]) else 0
        self._vocab_size = self._model.get_input_embeddings().num_embeddings
        probe = DynamicCache(config=self._model.config)
        if any(type(layer) is not DynamicLayer for layer in probe.layers):
            raise ValueError(f"HFEngine({model_path!r}): only full-attention caches are supported (no sliding window)")
        self.eos_token_ids = frozenset(self._default_eos() if eos_token_ids is None else eos_token_ids)
        self.version = 0
        self._adapter_name: str | None = None
        self._loads = 0
        self._waiting: list[RequestState] = []
        self._swaps: list[tuple[AdapterRef, asyncio.Future]] = []
        self._batch: RunningBatch | None = None
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None
        self._prefixes = PrefixCache(prefix_cache_min_tokens, int(prefix_cache_mib * 2**20))
        self._prefiller = Prefiller(self._prefixes, self.device)
        self._stats = {"steps": 0, "decode_rows": 0, "max_batch_size": 0, "prefill_tokens": 0,
                       "prefill_tokens_shared": 0, "prefill_tokens_cached": 0, "generated_tokens": 0,
                       "interrupted_rows": 0, "recomputed_tokens": 0, "prefill_forwards": 0,
                       "prefill_padding": 0, "decode_padding": 0}
        # seconds in the worker thread, by phase: decode forwards, prefills (and prefix warming), cache merges
        self._seconds = {"decode_s": 0.0, "prefill_s": 0.0, "merge_s": 0.0, "recompute_s": 0.0}

    @property
    def swaps_while_generating(self) -> bool:
        """Read by ``RolloutServer``: in interrupt mode a swap need not wait for the running generates."""
        return self.swap == "interrupt"

    def _default_eos(self) -> list[int]:
        eos = self._model.generation_config.eos_token_id
        eos = self._model.config.eos_token_id if eos is None else eos
        return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)

    @property
    def stats(self) -> dict[str, int]:
        """Counters: steps, decode_rows (sum of batch sizes), max_batch_size, prefill tokens computed, shared
        (copied from an identical prompt's row) and cached (a stored prefix's keys and values reused), generated
        tokens, interrupted/recomputed, prefill forwards, padding forwarded by prefills (tokens) and attended over by
        decode steps (cache positions summed over rows and steps); and seconds by phase (decode, prefill, merge, and
        recompute: rebuilding the running rows' cache after an interrupting swap)."""
        return {**self._stats, **{k: round(v, 3) for k, v in self._seconds.items()}}

    def failure(self) -> str | None:
        """Why the engine cannot make progress, or None: its loop task ended (it only ends by an error or
        ``close``) while requests wait. Cheap; for health checks while requests are running."""
        task = self._loop_task
        if task is None or not task.done() or not (self._waiting or self._batch):
            return None
        error = None if task.cancelled() else task.exception()
        return f"HFEngine({self.model_path!r}) loop stopped ({error!r}) with requests waiting"

    # ------------------------------------------------------------------ public API (event loop)

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, request_id: str) -> EngineOutput:
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError(f"request {request_id!r}: empty prompt_ids")
        if sampling.json_schema is not None:
            raise ValueError(f"request {request_id!r}: constrained decoding (json_schema) needs the vllm engine; "
                             "HFEngine samples freely")
        if not all(0 <= t < self._vocab_size for t in prompt):
            bad = next(t for t in prompt if not 0 <= t < self._vocab_size)
            # checked here: an out-of-range id would fail the forward pass of every request batched with it
            raise ValueError(f"request {request_id!r}: token id {bad} outside the vocabulary [0, {self._vocab_size})")
        if len(prompt) >= self.max_model_len:
            raise PromptTooLong(
                f"request {request_id!r}: prompt has {len(prompt)} tokens, max_model_len is {self.max_model_len} "
                "(the prompt must leave room for at least one new token)"
            )
        generator = torch.Generator()
        if sampling.seed is None:
            generator.seed()
        else:
            generator.manual_seed(sampling.seed)
        request = RequestState(
            request_id=request_id,
            prompt_ids=prompt,
            sampling=sampling,
            stop_ids=self.eos_token_ids | frozenset(sampling.stop_token_ids),
            generator=generator,
            future=asyncio.get_running_loop().create_future(),
        )
        self._waiting.append(request)
        self._notify()
        return await request.future

    async def load_adapter(self, ref: AdapterRef) -> None:
        """Sample with ``ref`` from now on (version 0 without a path = the base model): after the running
        requests finish (``drain``), or from the next decode step on (``interrupt``)."""
        future = asyncio.get_running_loop().create_future()
        self._swaps.append((ref, future))
        self._notify()
        await future

    async def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
            except Exception:  # the loop had stopped on an error (failure() reported it): still release everything
                pass
            self._loop_task = None
        closed = RuntimeError(f"HFEngine({self.model_path!r}) closed")
        pending = self._waiting + (self._batch.requests if self._batch else [])
        for request in pending:
            if not request.future.done():
                request.future.set_exception(closed)
        for _, future in self._swaps:
            if not future.done():
                future.set_exception(closed)
        self._waiting, self._swaps, self._batch = [], [], None

    # ------------------------------------------------------------------ the engine loop (event loop)

    def _notify(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop_task is None or self._loop_task.done() or self._loop_task.get_loop() is not loop:
            # first call, or the engine is now used from another event loop (e.g. successive asyncio.run):
            # work queued on a previous loop can never be answered there, so it is dropped
            self._batch = None
            self._waiting = [r for r in self._waiting if r.future.get_loop() is loop]
            self._swaps = [(ref, f) for ref, f in self._swaps if f.get_loop() is loop]
            self._wake = asyncio.Event()
            self._loop_task = loop.create_task(self._run(), name="hf-engine-loop")
        self._wake.set()

    async def _run(self) -> None:
        while True:
            if not (self._waiting or self._batch or self._swaps):
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._swaps and (self._batch is None or self.swap == "interrupt"):
                await self._apply_swaps()
                continue
            admitted = [] if self._swaps else self._admit()
            if self._batch is not None:
                for request in self._batch.requests:
                    if request.future.done():  # the caller went away: free its row
                        request.finish_reason = "abort"
            try:
                self._batch, finished = await asyncio.to_thread(self._step, self._batch, admitted)
            except Exception as error:  # fault boundary: fail this batch's callers, keep serving
                for request in admitted + (self._batch.requests if self._batch else []):
                    if not request.future.done():
                        request.future.set_exception(error)
                self._batch = None
                continue
            for request in finished:
                if not request.future.done():
                    request.future.set_result(
                        EngineOutput(
                            token_ids=tuple(request.token_ids),
                            logprobs=tuple(request.logprobs),
                            finish_reason=request.finish_reason,
                            policy_version=request.policy_version,
                            token_versions=tuple(request.token_versions),
                        )
                    )

    def _admit(self) -> list[RequestState]:
        room = self.max_batch_size - (len(self._batch.requests) if self._batch else 0)
        admitted = [r for r in self._waiting[:room] if not r.future.done()]
        self._waiting = self._waiting[room:]
        for request in admitted:
            request.policy_version = self.version
        return admitted

    async def _apply_swaps(self) -> None:
        swaps, self._swaps = self._swaps, []
        changed = False
        for ref, future in swaps:
            try:
                await asyncio.to_thread(self._set_adapter, ref)
            except Exception as error:  # the caller learns why; the engine keeps its previous adapter
                if not future.done():
                    future.set_exception(error)
            else:
                changed = True
                if not future.done():
                    future.set_result(None)
        if changed and self._batch is not None:  # interrupt mode: the running rows go on with the new weights
            try:
                started = time.perf_counter()
                self._batch = await asyncio.to_thread(self._recompute, self._batch)
                self._lap("recompute_s", started)
            except Exception as error:  # fault boundary, as in _run: fail these callers, keep serving
                for request in self._batch.requests:
                    if not request.future.done():
                        request.future.set_exception(error)
                self._batch = None

    # ------------------------------------------------------------------ model work (worker thread)

    @torch.inference_mode()
    def _step(self, batch: RunningBatch | None, admitted: list[RequestState]) -> tuple[RunningBatch | None, list[RequestState]]:
        """Decode one token for every running row and prefill the admitted requests."""
        parts = []
        if batch is not None:
            batch = keep_rows(batch, [i for i, r in enumerate(batch.requests) if r.finish_reason is None])
        clock = time.perf_counter()
        if batch is not None:
            self._decode(batch)
            parts.append(batch)
        clock = self._lap("decode_s", clock)
        self._stats["prefill_tokens"] += self._prefiller.warm(self._model, [r.prompt_ids for r in admitted])
        groups, prefixes = self._prefiller.groups([r.prompt_ids for r in admitted])
        for group in groups:
            parts.append(self._prefill([admitted[i] for i in group], [prefixes[i] for i in group]))
        clock = self._lap("prefill_s", clock)
        if not parts:
            return None, []
        merged = merge_batches(parts)
        finished = [r for r in merged.requests if r.finish_reason is not None]
        if finished and self._prefixes.enabled:  # the next turn of an episode starts with a finished sequence
            width = merged.attention_mask.shape[1]
            for row, request in enumerate(merged.requests):
                if request.finish_reason in ("stop", "length"):
                    tokens = request.prompt_ids + request.token_ids[:-1]  # the last token was never forwarded
                    self._prefixes.store_finished(tokens, merged.cache, row, width - len(tokens))
        self._lap("merge_s", clock)
        alive = [i for i, r in enumerate(merged.requests) if r.finish_reason is None]
        return keep_rows(merged, alive), finished

    def _lap(self, phase: str, since: float) -> float:
        now = time.perf_counter()
        self._seconds[phase] += now - since
        return now

    def _decode(self, batch: RunningBatch) -> None:
        mask = torch.cat([batch.attention_mask, batch.attention_mask.new_ones(len(batch.requests), 1)], dim=1)
        positions = batch.attention_mask.sum(dim=1, keepdim=True)  # [B, 1] tokens already in the cache
        out = self._model(
            input_ids=batch.next_ids.unsqueeze(1).to(self.device),  # [B, 1]
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            past_key_values=batch.cache,
            use_cache=True,
        )
        batch.attention_mask = mask
        self._stats["steps"] += 1
        self._stats["decode_rows"] += len(batch.requests)
        self._stats["decode_padding"] += int(mask.numel() - mask.sum())
        self._stats["max_batch_size"] = max(self._stats["max_batch_size"], len(batch.requests))
        batch.next_ids = self._append(batch.requests, out.logits[:, -1])

    def _prefill(self, group: list[RequestState], prefixes: list) -> RunningBatch:
        """Prompts prefilled in one forward; samples each one's first token."""
        out = self._prefiller.forward(self._model, [r.prompt_ids for r in group], prefixes)
        self._stats["prefill_forwards"] += 1
        self._stats["prefill_tokens"] += out.computed
        self._stats["prefill_tokens_cached"] += out.reused
        self._stats["prefill_tokens_shared"] += int(out.mask.sum()) - out.computed - out.reused
        self._stats["prefill_padding"] += out.padding
        return RunningBatch(group, out.cache, out.mask, self._append(group, out.logits))

    @torch.inference_mode()
    def _recompute(self, batch: RunningBatch) -> RunningBatch | None:
        """Rebuild the running rows' KV cache with the current weights (after an interrupting swap).

        A row's cache holds its prompt and every sampled token but the last, which ``next_ids`` feeds to
        the next decode step; rows are prefilled again, grouped as admitted prompts are.
        """
        running = [r for r in batch.requests if r.finish_reason is None and not r.future.done()]
        for request in running:
            request.policy_version = min(request.policy_version, self.version)
        sequences = [r.prompt_ids + r.token_ids[:-1] for r in running]
        parts = []
        groups, prefixes = self._prefiller.groups(sequences)
        for indices in groups:
            group = [running[i] for i in indices]
            out = self._prefiller.forward(self._model, [sequences[i] for i in indices], [prefixes[i] for i in indices])
            parts.append(RunningBatch(group, out.cache, out.mask, torch.tensor([r.token_ids[-1] for r in group])))
            self._stats["interrupted_rows"] += len(group)
            self._stats["recomputed_tokens"] += out.computed
            self._stats["prefill_padding"] += out.padding
        return merge_batches(parts) if parts else None

    def _append(self, requests: list[RequestState], logits: torch.Tensor) -> torch.Tensor:
        """Sample one token per row from logits [B, V], record it, mark finished rows; returns ids [B]."""
        tokens, logprobs = sample_next(logits.cpu(), requests)
        for request, token, logprob in zip(requests, tokens, logprobs):
            request.token_ids.append(token)
            request.logprobs.append(logprob)
            request.token_versions.append(self.version)
            if token in request.stop_ids:
                request.finish_reason = "stop"
            elif len(request.token_ids) >= request.sampling.max_new_tokens or (
                len(request.prompt_ids) + len(request.token_ids) >= self.max_model_len
            ):
                request.finish_reason = "length"
        self._stats["generated_tokens"] += len(tokens)
        return torch.tensor(tokens)

    def _set_adapter(self, ref: AdapterRef) -> None:
        """Point the model at ``ref``'s adapter; called between steps (no forward pass is running).

        Version 0 is the run's starting policy: the base model, or the saved adapter a run starts from
        (``ref.path`` set), loaded like any published one.
        """
        from peft import PeftModel

        self._prefixes.clear()  # cached keys and values belong to the weights that computed them
        if not ref.path:  # version 0, base model (AdapterRef: a version > 0 always has a path)
            if self._adapter_name is not None:
                self._model.base_model.disable_adapter_layers()
            self.version = 0
            return
        if not os.path.isdir(ref.path):
            raise FileNotFoundError(f"adapter version {ref.version}: no adapter folder at {ref.path!r}")
        # a fresh slot name per load: peft needs unique names, and the previous slot is deleted after the switch
        self._loads += 1
        name = f"policy_{self._loads}"
        previous = self._adapter_name
        if previous is None:
            self._model = PeftModel.from_pretrained(self._model, ref.path, adapter_name=name, is_trainable=False)
        else:
            self._model.load_adapter(ref.path, adapter_name=name, is_trainable=False)
            self._model.set_adapter(name)
            self._model.delete_adapter(previous)
            self._model.base_model.enable_adapter_layers()
        self._model.eval()
        self._adapter_name = name
        self.version = ref.version
