"""An Agent Lightning 0.3.x agent trains on tandem-rl through 0.3.x's own ``Trainer.fit``, with
``tandem_rl_agl.TandemRL`` where its SQL guide has ``agl.VERL`` (agentlightning==0.3.0 and that package in their own
venv, made by ``make agl03-venv``): two GRPO steps with LoRA on the tiny model.

The agent (tests/fixtures/agent_lightning03/parity_agent.py) makes one chat call through the rollout's own base URL,
written both ways 0.3.x agents are: half the tasks run a ``LitAgent`` subclass (``main_llm.get_base_url``), half an
``@agl.rollout`` function (handed an ``llm`` already pointed at the rollout); across both, half the tasks return the
reward as a float, half ``emit_reward`` it. What each
side saw is read back independently: the store's rollouts and spans (dumped by the driver when the run ends), the
agent's own log of every response, the run's metrics, accounting and trained batches (``rollout_data_dir``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.ray_head import free_port

# Its cluster is its own, on free ports: it runs in the session-cluster worker, which has the time to spare.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.own_cluster,
              pytest.mark.xdist_group("session_cluster")]
ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "agent_lightning03"
REWARD = "agentlightning.reward.0.value"


@pytest.fixture(scope="module")
def agl03_venv() -> Path:
    venv = ROOT / ".venv-agl03"
    subprocess.run(["bash", str(ROOT / "scripts" / "agl_venv.sh"), str(venv), "requirements/agentlightning03.txt",
                    "./integrations/agentlightning"], cwd=ROOT, check=True, timeout=900)
    return venv


def test_agent_lightning03_trainer_fit_with_tandem_rl_as_its_algorithm_trains_two_grpo_steps(tmp_path, tiny_model_dir,
                                                                                                agl03_venv):
    run_dir, batches = tmp_path / "run", tmp_path / "batches"
    agent_log, store_dump = tmp_path / "agent.jsonl", tmp_path / "store.json"
    tasks = [{"question": f"Say a number near {i}.", "reward_via": "emit" if i % 2 else "float",
              "agent": "decorated" if i >= 2 else "class"} for i in range(4)]
    overrides = [
        f"actor_rollout_ref.model.path={tiny_model_dir}", "trainer.val_before_train=false", "trainer.test_freq=-1",
        "trainer.validation_data_dir=null", "trainer.total_training_steps=2", "trainer.save_freq=-1",
        f"trainer.default_local_dir={run_dir}", f"trainer.rollout_data_dir={batches}", "data.train_batch_size=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.n=4", "data.max_response_length=48",
        "sft.enabled=false", f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlruns.db'}",
        "serve.app_name=train-agl03", "stream.max_staleness=0",
    ]
    args = {"config": str(ROOT / "configs" / "demo_cpu.yaml"), "overrides": overrides, "python": sys.executable,
            "cwd": str(ROOT), "serve_port": free_port(), "store_port": free_port(), "n_runners": 2, "train": tasks,
            "store_dump": str(store_dump)}
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(FIXTURES), "AGL_TEST_LOG": str(agent_log),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # litellm (imported by agentlightning) fetches a price list otherwise
    for name in ("RAY_ADDRESS", "VIRTUAL_ENV"):
        env.pop(name, None)
    proc = subprocess.run([str(agl03_venv / "bin" / "python"), str(FIXTURES / "train_driver.py"), json.dumps(args)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]

    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if int(s["step"]) > 0]
    assert [int(s["step"]) for s in steps] == [1, 2]
    book = json.loads((run_dir / "accounting.json").read_text())
    assert book["groups/balanced"] == 1 and book["groups/failed"] == 0, book
    assert book["groups/admitted"] == book["groups/trained"] == 4, book  # nothing started after the last step

    # the store's side: 2 steps x 2 tasks x 4 samples, each succeeded with the reward the agent handed over
    stored = json.loads(store_dump.read_text())
    seen = {e["rollout_id"]: e for e in map(json.loads, agent_log.read_text().splitlines())}
    assert len(stored) == 16 and all(s["rollout"]["status"] == "succeeded" for s in stored), [
        (s["rollout"]["rollout_id"], s["rollout"]["status"]) for s in stored]
    assert set(seen) == {s["rollout"]["rollout_id"] for s in stored}
    by_via, by_agent = Counter(), Counter()
    for entry in stored:
        rollout = entry["rollout"]
        mine = seen[rollout["rollout_id"]]
        rewards = [s["attributes"][REWARD] for s in entry["spans"] if REWARD in (s.get("attributes") or {})]
        assert rewards == [mine["reward"]], (rollout["rollout_id"], rewards, mine)  # a float return or emit_reward
        by_via[mine["via"]] += 1
        by_agent[mine["agent"]] += 1
        assert f"/rollout/{rollout['rollout_id']}/attempt/{mine['attempt_id']}/v1" in mine["base_url"]
        assert mine["logprobs"] == len(mine["token_ids"]) > 0  # one log-prob per response token
        step = int(rollout["metadata"]["admitted_at_version"]) + 1  # max_staleness=0: sampled by the previous step
        assert mine["fingerprint"] == f"policy-v{step - 1}", (step, mine["fingerprint"])  # step 2 sampled by v1
    assert by_via == {"float": 8, "emit": 8}, by_via  # 4 tasks in 2 steps of 2: each task once, 4 samples each
    assert by_agent == {"class": 8, "decorated": 8}, by_agent

    # what was trained is what the agent got: per group, the decoded responses and rewards of its rollouts
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    groups: dict[str, list[tuple[str, float]]] = {}
    for entry in stored:
        mine = seen[entry["rollout"]["rollout_id"]]
        text = tokenizer.decode(mine["token_ids"], skip_special_tokens=True)
        groups.setdefault(entry["rollout"]["input"]["question"], []).append((text, mine["reward"]))  # one task, one group
    learnable = False
    for s in steps:
        trained: dict[str, list[tuple[str, float]]] = {}
        for line in (batches / f"{int(s['step'])}.jsonl").read_text().splitlines():
            row = json.loads(line)  # the trained sample, decoded: the prompt the agent sent holds its task's question
            (question,) = [q for q in groups if q in row["input"]]
            trained.setdefault(question, []).append((row["output"], float(row["score"])))
        assert len(trained) == 2 and all(sorted(trained[g]) == sorted(groups[g]) for g in trained), (trained, groups)
        rewards = [r for g in trained.values() for _, r in g]
        assert s["reward/mean"] == pytest.approx(sum(rewards) / len(rewards))
        learnable |= any(len({r for _, r in g}) > 1 for g in trained.values())

    # GRPO learned from them: LoRA's B is zero at v0 and moves once a group's rewards differ (1/8 of groups of four
    # 50/50 rewards are all equal; all four groups ~0.02 %)
    from safetensors.torch import load_file

    assert learnable, groups
    final = load_file(run_dir / "adapters" / "v2" / "adapter_model.safetensors")
    assert any(t.abs().sum() > 0 for k, t in final.items() if "lora_B" in k)
