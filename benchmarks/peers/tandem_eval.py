"""The one evaluator of benchmarks.peer_trl: held-out greedy accuracy of a model (TRL's or tandem-rl's adapters on the
SFT model) with tandem-rl's own ToolAgentLoop (parser qwen25_coder, budgets, tool execution, reward) over an
in-process batched greedy HF generate. Imported by trl_grpo.py (same folder), which passes the demo's budgets."""

from __future__ import annotations

import asyncio
import time

class GreedyBatchGenerator:
    """tandem-rl's Generator protocol over an in-process model: greedy, requests batched as they arrive."""

    def __init__(self, model, tok, max_batch: int = 64):
        self.model, self.tok, self.max_batch = model, tok, max_batch
        self.pending: list = []
        self.task = None
        self.generated = 0

    async def generate(self, request):
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((request, fut))
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._drain())
        return await fut

    async def _drain(self):
        while self.pending:
            for _ in range(5):
                await asyncio.sleep(0)  # let every episode that can submit now do so
            batch, self.pending = self.pending[: self.max_batch], self.pending[self.max_batch:]
            try:
                results = self._run([r for r, _ in batch])
            except BaseException as exc:  # noqa: BLE001
                for _, f in batch:
                    f.set_exception(exc)
                continue
            for (_, f), res in zip(batch, results):
                f.set_result(res)

    def _run(self, requests):
        import torch

        from agents.records import GenerateResult

        tok, eos = self.tok, self.tok.eos_token_id
        width = max(len(r.prompt_ids) for r in requests)
        pad = tok.pad_token_id
        ids = torch.tensor([[pad] * (width - len(r.prompt_ids)) + list(r.prompt_ids) for r in requests])
        att = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in requests])
        max_new = max(r.sampling.max_new_tokens for r in requests)
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=att, max_new_tokens=max_new, do_sample=False,
                                      eos_token_id=eos, pad_token_id=pad, temperature=None, top_p=None, top_k=None)
        results = []
        for r, row in zip(requests, out[:, width:].tolist()):
            row = row[: r.sampling.max_new_tokens]
            finish = "length"
            if eos in row:
                row = row[: row.index(eos) + 1]
                finish = "stop"
            self.generated += len(row)
            results.append(GenerateResult(token_ids=tuple(row), logprobs=(0.0,) * len(row), finish_reason=finish,
                                          policy_version=0))
        return results


def evaluate(model, tok, rows, label: str, demo: dict) -> dict[str, float]:
    """Held-out greedy accuracy with tandem-rl's ToolAgentLoop (val_kwargs: do_sample false, n 1)."""
    from functools import partial

    from agents.chat import ChatDelta
    from agents.data.rows import DatasetRow
    from agents.loops import AgentContext, LoopLimits, episodes_for_row, run_episode
    from agents.parsers import parse_tool_calls
    from agents.records import SamplingParams
    from agents.tools.registry import load_tools

    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    gen = GreedyBatchGenerator(model, tok)
    limits = LoopLimits(max_response_length=demo["max_response_length"],
                        max_model_len=demo["max_prompt_length"] + demo["max_response_length"],
                        max_assistant_turns=demo["max_assistant_turns"], max_parallel_calls=demo["max_parallel_calls"],
                        max_tool_response_length=demo["max_tool_response_length"],
                        max_prompt_length=demo["max_prompt_length"], truncation="error")
    ctx = AgentContext(generator=gen, chat=ChatDelta(tok), parse=partial(parse_tool_calls, fmt="qwen25_coder"),
                       limits=limits, tools=load_tools({"tools": [{"class_name": "calculator"}]}))
    sampling = SamplingParams(temperature=0.0, stop_token_ids=(tok.eos_token_id,))

    async def run_all():
        eps = [e for i, r in enumerate(rows)
               for e in episodes_for_row(DatasetRow.model_validate(r), 1, sampling, group_id=f"val-{i}",
                                         default_agent_loop="tool_agent")]
        return await asyncio.gather(*(run_episode(ctx, e, "tool_agent") for e in eps)), eps

    results, eps = asyncio.run(run_all())
    by_src: dict[str, list[float]] = {}
    calls = 0
    for e, res in zip(eps, results):
        t = res.trajectory
        by_src.setdefault(e.data_source, []).append(t.reward_extra.get("acc", t.reward))
        calls += t.num_tool_calls
    metrics = {f"val-core/{s}/acc/mean@1": sum(v) / len(v) for s, v in sorted(by_src.items())}
    metrics["val-aux/tool_calls/mean"] = calls / len(eps)
    dt = time.perf_counter() - t0
    print(f"[eval {label}] " + "  ".join(f"{k} {v:.3f}" for k, v in metrics.items())
          + f"  ({len(eps)} rows, {gen.generated} generated tokens, {dt:.1f}s, not in the training time)", flush=True)
    if was_training:
        model.train()
    return metrics
