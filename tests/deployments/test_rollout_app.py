"""The rollout app on a local Ray cluster: token-in/token-out generate, batching, adapters, versions."""

from __future__ import annotations

import asyncio
from functools import lru_cache
from pathlib import Path

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agents.records import AdapterRef, GenerateRequest, GenerateResult, SamplingParams
from deployments.adapter_registry import AdapterRegistry
from deployments.engines.base import PromptTooLong
from deployments.engines.hf_engine import HFEngine
from deployments.rollout_server import RolloutServer
from tests.deployments.conftest import MAX_MODEL_LEN

pytestmark = pytest.mark.integration

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


def _prompt(model_dir: Path, text: str) -> tuple[int, ...]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": "user", "content": text}]
    return tuple(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))


@lru_cache(maxsize=4)
def _reference_model(model_dir: Path, adapter: Path | None):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    return model.eval()


def _check_against_transformers(result: GenerateResult, prompt: tuple[int, ...], model) -> None:
    """Greedy tokens equal ``model.generate``'s, and logprobs equal a teacher-forced forward pass."""
    n = len(result.token_ids)
    with torch.no_grad():
        expected = model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=n
        )[0, len(prompt):].tolist()
        assert list(result.token_ids) == expected
        logits = model(torch.tensor([prompt + result.token_ids])).logits[0, len(prompt) - 1 : -1]  # [n, V]
        logprobs = torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(result.token_ids)[:, None])
    assert torch.allclose(torch.tensor(result.logprobs), logprobs[:, 0], atol=1e-4)


def test_generate_returns_token_ids_logprobs_and_version(rollout_app):
    prompt = _prompt(rollout_app.model_dir, "What is 2 + 3?")
    result = rollout_app.handle.generate.remote(GenerateRequest(prompt, GREEDY, trajectory_id="t-basic")).result()
    assert isinstance(result, GenerateResult)
    assert 1 <= len(result.token_ids) <= GREEDY.max_new_tokens
    assert len(result.logprobs) == len(result.token_ids)
    assert all(lp <= 0.0 for lp in result.logprobs)
    assert result.finish_reason in ("stop", "length")
    assert result.replica_id and result.policy_version >= 0


def test_greedy_output_equals_transformers_generate(rollout_app):
    prompt = _prompt(rollout_app.model_dir, "Name three colors.")
    result = rollout_app.handle.generate.remote(GenerateRequest(prompt, GREEDY, trajectory_id="t-greedy")).result()
    # The shared app may already serve a published adapter: compare with the same policy.
    adapter = rollout_app.adapters[result.policy_version] if result.policy_version else None
    _check_against_transformers(result, prompt, _reference_model(rollout_app.model_dir, adapter))


def test_prompt_longer_than_max_model_len_is_rejected(rollout_app):
    request = GenerateRequest(tuple(range(1, MAX_MODEL_LEN + 1)), GREEDY, request_id="too-long-1")
    with pytest.raises(PromptTooLong, match="too-long-1"):
        rollout_app.handle.generate.remote(request).result()


def test_sixteen_concurrent_requests_are_served_together(rollout_app):
    prompts = [_prompt(rollout_app.model_dir, f"Count to {i}.") for i in range(16)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24, seed=7)
    # One trajectory id: all 16 go to one replica, which must batch them rather than queue them.
    responses = [
        rollout_app.handle.generate.remote(GenerateRequest(p, sampling, trajectory_id="t-16", request_id=f"c{i}"))
        for i, p in enumerate(prompts)
    ]
    results = [r.result() for r in responses]
    assert len({r.replica_id for r in results}) == 1
    assert all(len(r.token_ids) == len(r.logprobs) >= 1 for r in results)
    stats = rollout_app.handle.replica_stats.remote(trajectory_id="t-16").result()
    assert stats["replica_id"] == results[0].replica_id
    assert stats["peak_in_flight"] >= 2


def test_published_adapter_changes_outputs_and_policy_version(rollout_app, adapter_paths):
    prompt = _prompt(rollout_app.model_dir, "Tell me a story.")
    seen: dict[int, tuple[int, ...]] = {}
    for adapter in (adapter_paths[1], adapter_paths[2]):
        version, loaded = rollout_app.publish_next(adapter)
        assert len(loaded) == 2 and set(loaded.values()) == {version}  # both replicas, before publish returned
        for trajectory in ("t-adapter-a", "t-adapter-b", "t-adapter-c"):
            result = rollout_app.handle.generate.remote(GenerateRequest(prompt, GREEDY, trajectory_id=trajectory)).result()
            assert result.policy_version == version
            _check_against_transformers(result, prompt, _reference_model(rollout_app.model_dir, adapter))
        seen[version] = result.token_ids
    base = _reference_model(rollout_app.model_dir, None)
    with torch.no_grad():
        base_ids = tuple(base.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12)[0, len(prompt):])
    assert len({*seen.values(), base_ids}) == 3  # each policy samples differently


def test_replica_started_after_a_publish_loads_the_newest_adapter_first(ray_cluster, tiny_model_dir, adapter_paths):
    registry = AdapterRegistry.options(name="late-replica-test", namespace="tandem-tests").remote()
    # Published while no replica is live: returns at once with nobody to wait for.
    assert ray.get(registry.publish.remote(AdapterRef(1, str(adapter_paths[1])), 5.0)) == {}
    prompt = _prompt(tiny_model_dir, "Hello there.")

    async def scenario():
        server = RolloutServer(HFEngine(str(tiny_model_dir), max_model_len=MAX_MODEL_LEN), replica_id="late")
        await server.follow(registry, poll_s=0.5)
        first = await server.generate(GenerateRequest(prompt, GREEDY))
        loaded = await registry.publish.remote(AdapterRef(2, str(adapter_paths[2])), 30.0)
        second = await server.generate(GenerateRequest(prompt, GREEDY))
        await server.close(registry)
        return first, loaded, second, server.engine_stats()

    first, loaded, second, stats = asyncio.run(scenario())
    # the engine's counters as a load benchmark reads them from the replica: two answers' tokens, decode time
    assert stats["generated_tokens"] == len(first.token_ids) + len(second.token_ids) and stats["decode_s"] > 0
    assert first.policy_version == 1 and first.replica_id == "late"
    _check_against_transformers(first, prompt, _reference_model(tiny_model_dir, adapter_paths[1]))
    assert loaded == {"late": 2}
    assert second.policy_version == 2
    assert ray.get(registry.live_replicas.remote()) == {}  # close() unregistered it
    ray.kill(registry)
