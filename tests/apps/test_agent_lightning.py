"""An unchanged Agent Lightning 1.x agent trains on tandem-rl: ``agl-server`` + ``agl-controller`` (agentlightning==1.0.2,
in its own venv made by ``scripts/agl_venv.sh``) run Agent Lightning's own GSM8K ``ChatAgent`` (vendored byte for
byte, hash pinned) against tandem-rl's ingress, and ``apps.train`` runs two GRPO steps with LoRA on its rollouts.

Everything is read back from the two sides independently: the rollouts, their LLM calls and reward events from
agl-server's store (``keep_rollouts=true``), the steps from the run's ``metrics.jsonl`` and accounting.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from agents.data import arithmetic
from agents.data.rows import validate_row, write_parquet
from agents.parsers import strip_end_markers
from tests.apps.test_train import _train
from tests.ray_head import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.own_cluster]
ROOT = Path(__file__).resolve().parents[2]
VENDORED = ROOT / "tests" / "fixtures" / "agent_lightning"
AGENT_FILE = VENDORED / "examples" / "gsm8k" / "gsm8k_agent.py"
AGENT_SHA256 = "6c115fb0a7757bb24ebf1a86a23ffb67a52a220a06e99f1c6591f2ee70d003ac"  # agent-lightning@c632d8dd
KEY = "agl-test-key"
MODEL = "tandem-policy"


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct (the demo's real model, from the offline GGUF): the tiny random model never earns a
    reward, and without rewards that differ inside a group GRPO has nothing to learn from."""
    from apps.prepare_model import prepare_model

    return prepare_model("smollm2-135m", tmp_path_factory.mktemp("models") / "smollm2-135m")


@pytest.fixture(scope="module")
def agl_venv() -> Path:
    venv = ROOT / ".venv-agl"
    subprocess.run(["bash", str(ROOT / "scripts" / "agl_venv.sh"), str(venv)], check=True, timeout=900)
    print((venv / ".ready").read_text().strip())  # which Python ran it (3.12, or 3.11 with --ignore-requires-python)
    return venv


@pytest.fixture
def agl_server(agl_venv: Path, tmp_path: Path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(VENDORED)}
    env.pop("VIRTUAL_ENV", None)
    logs = [open(tmp_path / "agl-server.log", "w"), open(tmp_path / "agl-controller.log", "w")]
    server = subprocess.Popen(
        [str(agl_venv / "bin" / "agl-server"), f"port={port}", "host=127.0.0.1", f"key={KEY}",
         f"default_proxy.model_name={MODEL}", f"hydra.run.dir={tmp_path / 'agl-server'}"],  # Hydra apps: not ./outputs
        env=env, stdout=logs[0], stderr=subprocess.STDOUT)
    procs = [server]
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "agl-server.log").read_text()
            time.sleep(0.5)
        procs.append(subprocess.Popen(
            [str(agl_venv / "bin" / "agl-controller"), "runner_type=local", f"agl_server.url={url}",
             f"agl_server.key={KEY}", "local_runner.poll_interval=1", f"hydra.run.dir={tmp_path / 'agl-controller'}"],
            cwd=VENDORED, env=env, stdout=logs[1], stderr=subprocess.STDOUT))
        yield url
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs:
            log.close()


def _get(url: str, path: str, **params) -> object:
    response = httpx.get(f"{url}{path}", params=params, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    response.raise_for_status()
    return response.json()


def test_agent_lightnings_own_gsm8k_agent_trains_two_grpo_steps_unchanged(tmp_path, smollm2_dir, agl_server):
    assert hashlib.sha256(AGENT_FILE.read_bytes()).hexdigest() == AGENT_SHA256, "the vendored agent was edited"
    rows = tmp_path / "train.parquet"
    # Single-digit sums and products only: through this agent's prompt (temperature 1, ~280 tokens of room) SmolLM2
    # answered 24 of 180 samples right over 15 such questions, these 8 included (1-2 of 12 each); a two-digit sum 0 of
    # 12. At that rate a group of 8 samples is all 0 (nothing to learn) 0.87^8 = 0.32 of the time, the four groups of
    # the two steps 1% (4 samples of the seed's mixed rows, half of them multi-digit products, made that far likelier).
    made = [{**r, "agent_name": "agent_lightning"}
            for r in arithmetic.make_rows(8, seed=5, split="train", hard_fraction=0.0)]
    write_parquet([validate_row(r, f"row {i}") for i, r in enumerate(made)], rows)
    proc, run_dir = _train(
        tmp_path, smollm2_dir, rows,
        "trainer.total_training_steps=2", "trainer.save_freq=-1", "stream.max_staleness=0",
        # The vendored agent asks for max_tokens=1024 and gets what the 352-token context leaves (~280 tokens). A
        # 128-token prompt budget (~150 new tokens) halved the rollouts' time, but SmolLM2 then rarely reached the
        # agent's answer format: a clean-checkout run had all 16 rewards 0 and nothing to learn.
        "actor_rollout_ref.rollout.n=8", "data.max_response_length=96",
        "actor_rollout_ref.rollout.agent.default_agent_loop=agent_lightning",
        f"agent_lightning.server_url={agl_server}", "agent_lightning.api_key_env=AGL_TEST_KEY",
        f"agent_lightning.model_name={MODEL}", "agent_lightning.agent_class=examples.gsm8k.gsm8k_agent.ChatAgent",
        "agent_lightning.env_map={QUESTION: input.question, ANSWER: input.answer}",
        "agent_lightning.input_fields={question: messages.-1.content}",  # extra_info.question and .answer are in already
        "agent_lightning.keep_rollouts=true", "agent_lightning.timeout_s=300",
        # ~5.5 min alone here; beside the other xdist worker on CI one run passed 600 s
        env={"AGL_TEST_KEY": KEY}, timeout=1200,
    )
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if int(s["step"]) > 0]
    assert [int(s["step"]) for s in steps] == [1, 2]
    book = json.loads((run_dir / "accounting.json").read_text())
    failures = [line for line in (proc.stdout + proc.stderr).splitlines() if "failed on worker" in line]
    assert book["groups/balanced"] == 1 and book["groups/failed"] == 0, (book, failures)

    # agl-server's side: every rollout of the run, its calls and its reward events.
    rollouts = _get(agl_server, "/api/rollouts", state_in=["queuing", "running", "succeeded", "failed"], limit=500)
    # with max_staleness=0 a group admitted at policy version v is trained at step v + 1
    step_of = {r["rollout_id"]: int(r["metadata"]["admitted_at_version"]) + 1 for r in rollouts}
    trained_steps = [r for r in rollouts if step_of[r["rollout_id"]] <= 2]
    assert trained_steps and all(r["status"]["state"] == "succeeded" for r in trained_steps), [
        (step_of[r["rollout_id"]], r["status"]["state"], r["status"]["error_message"]) for r in rollouts]
    # admission stops at the groups the run trains: none is started for a step after the last
    later = [(r["status"]["state"], r["status"]["error_message"]) for r in rollouts if step_of[r["rollout_id"]] > 2]
    assert later == [] and book["groups/admitted"] == book["groups/trained"] == 4, (later, book)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    by_step: dict[int, list[float]] = {}
    versions: dict[int, set[int]] = {}
    rewards_of: dict[str, float] = {}
    group_of: dict[str, str] = {}
    for rollout in trained_steps:
        events = _get(agl_server, f"/api/rollouts/{rollout['rollout_id']}/events")
        calls = [e["data"] for e in events if e["event_type"] == "model_request"]
        rewards = [e["data"]["value"] for e in events if e["event_type"] == "reward"]
        assert len(calls) == 1 and len(rewards) == 1, (rollout["rollout_id"], events)
        response = calls[0]["response"]
        choice = response["choices"][0]
        ids = choice["token_ids"]
        # the ids are the text the agent read (the ingress keeps special tokens a model writes mid-answer, as tool-call
        # markers may be special tokens, and drops only the end-of-turn markers it ends with)
        assert strip_end_markers(tokenizer.decode(ids, skip_special_tokens=False), tokenizer) == choice["message"]["content"]
        assert len(choice["logprobs"]["content"]) == len(ids)  # one log-prob per response token
        assert calls[0]["request"]["model"] == MODEL and calls[0]["request"]["return_token_ids"] is True
        step = step_of[rollout["rollout_id"]]
        by_step.setdefault(step, []).append(float(rewards[0]))
        rewards_of[rollout["rollout_id"]] = float(rewards[0])
        group_of[rollout["rollout_id"]] = rollout["metadata"]["group_id"]
        versions.setdefault(step, set()).add(int(response["system_fingerprint"].removeprefix("policy-v")))
    # 2 prompts x 8 samples per step, at least (a group cut by the step boundary is left over, never dropped).
    assert set(by_step) >= {1, 2} and all(len(by_step[s]) >= 16 for s in (1, 2)), by_step
    assert versions[1] == {0} and versions[2] == {1}, versions  # step 2 was sampled by the step-1 policy
    for s in steps:  # GRPO's rewards are the agent's own reward events
        trained = sorted(by_step[int(s["step"])])
        assert s["reward/mean"] == pytest.approx(sum(trained) / len(trained)), (s["step"], trained, s["reward/mean"])

    # The adapter moved exactly when GRPO had something to learn: a group whose rewards differ gives non-zero advantages
    # and changes LoRA's B (zero at v0); groups of equal rewards (no KL, no entropy term) leave it where it was.
    from safetensors.torch import load_file

    adapters = {v: load_file(run_dir / "adapters" / f"v{v}" / "adapter_model.safetensors") for v in (1, 2)}
    adapters[0] = {k: (t if "lora_A" in k else t * 0) for k, t in adapters[1].items()}
    learned = []
    for step in (1, 2):
        groups: dict[str, list[float]] = {}
        for rollout, reward in rewards_of.items():
            if step_of[rollout] == step:
                groups.setdefault(group_of[rollout], []).append(reward)
        learnable = any(len(set(g)) > 1 for g in groups.values())
        moved = any(not (adapters[step][k] == adapters[step - 1][k]).all() for k in adapters[step] if "lora_B" in k)
        print(f"step {step}: groups {sorted(groups.values())}, lora_B moved: {moved}")
        # step 1: LoRA's B is zero at v0, so it moves iff a group's rewards differ; after a step that moved it,
        # AdamW's first moment (and weight decay) move it again even when every advantage is zero
        assert moved == learnable if step == 1 else moved or not learnable, (step, groups, moved)
        learned.append(moved)
    assert any(learned), "every group's rewards were equal in both steps: the adapter never changed"


def _client(server_url: str, agent_class: str, **kw):
    from agents.loops.agent_lightning import AglClient, AglSettings

    settings = AglSettings(server_url=server_url, agent_class=agent_class, model_name=MODEL, api_key=KEY,
                           env_map={"QUESTION": "input.question"}, poll_interval_s=0.2, **kw)
    return AglClient(settings, "http://127.0.0.1:9")  # registered only: these agents never call the model


def test_failed_timed_out_and_empty_rollouts_raise_naming_the_rollout(agl_server):
    """An agent that crashes, one that outlives its timeout and one that never calls the model each fail their
    episode (the coordinator counts the group failed) with a message naming the rollout; nothing is dropped silently."""
    import asyncio

    from agents.loops import AgentContext, LoopLimits
    from agents.loops.agent_lightning import RolloutFailed, run_agent_lightning
    from agents.loops.episode import Episode
    from agents.records import SamplingParams

    episode = Episode(trajectory_id="t-0", group_id="t", messages=({"role": "user", "content": "1+1?"},),
                      agent_name="agent_lightning", data_source="d", ground_truth="2", sampling=SamplingParams(),
                      extra_info={"index": 7, "question": "1+1?"})

    async def run(agent_class: str, **kw) -> str:
        client = _client(agl_server, agent_class, **kw)
        ctx = AgentContext(generator=None, chat=None, parse=None, limits=LoopLimits(96, 352),  # type: ignore[arg-type]
                           agent_lightning=client)
        try:
            with pytest.raises(RolloutFailed) as failure:
                await run_agent_lightning(ctx, episode)
        finally:
            await client.close()
        return str(failure.value)

    crashed = asyncio.run(run("tandem_test_agents.Crashes"))
    assert "t-0" in crashed and "subprocess exited with code" in crashed, crashed
    timed_out = asyncio.run(run("tandem_test_agents.Hangs", timeout_s=2.0, wait_margin_s=30.0))
    assert "timed out" in timed_out, timed_out
    empty = asyncio.run(run("tandem_test_agents.Silent"))
    assert "made no successful LLM call" in empty, empty
    # each was deleted after reading (keep_rollouts=false): the server's in-memory store does not grow
    assert _get(agl_server, "/api/rollouts", state_in=["queuing", "running", "succeeded", "failed"]) == []
