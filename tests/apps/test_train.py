"""``python -m apps.train`` end to end, streaming, on the tiny model.

Each run is its own process with its own local Ray cluster, exactly as a user starts it. The batch-synchronous run
(on vLLM) is the two-node ``ray job submit`` test's (tests/apps/test_ray_job.py): each run costs 1.5-3 min of CI.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.data import arithmetic
from agents.data.rows import validate_row, write_parquet
from tests.apps.run_checks import check_run
from tests.ray_head import free_port

# Its runs take free ports: it runs in the session-cluster worker, which finished ~5 min before the own-cluster one.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.own_cluster,
              pytest.mark.xdist_group("session_cluster")]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def train_rows(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.parquet"
    rows = [validate_row(r, f"row {i}") for i, r in enumerate(arithmetic.make_rows(32, seed=3, split="train"))]
    write_parquet(rows, path)
    return path


def _train(tmp_path: Path, model: Path, rows: Path, *extra: str, env: dict[str, str] | None = None,
           timeout: float = 600) -> tuple[subprocess.CompletedProcess, Path]:
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "apps.train", "--config", "configs/demo_cpu.yaml",
        f"actor_rollout_ref.model.path={model}", f"data.train_files={rows}", "data.val_files=null",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.validation_data_dir=null",
        "trainer.total_training_steps=3", "trainer.save_freq=2", f"trainer.default_local_dir={run_dir}",
        "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.rollout.n=2", "data.max_response_length=48", "sft.enabled=false",
        f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlruns.db'}", "serve.app_name=train-test",
        f"serve.port={free_port()}", *extra,
    ]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT), **(env or {})}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc, run_dir


VERL_TOOLS = """tools:
  - class_name: calculator
  - class_name: tests.agents.tools.verl_style_tool.AnswerCheckTool
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: check_answer
        description: Check an answer.
        parameters: {type: object, properties: {answer: {type: string}}, required: [answer]}
"""
REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, base=0.0):
    return {"score": base + 0.25, "acc": 1.0}
"""


def test_streaming_run_validates_before_during_after_then_val_only_on_the_final_adapter(tmp_path, tiny_model_dir,
                                                                                       train_rows):
    """A streaming run (the default) with held-out validation before, every 2 steps and after, then a ``val_only`` run
    of its final adapter. Both use verl's extension points as a verl user writes them: a BaseTool subclass named in
    the tool config, a custom_reward_function file (with reward_kwargs) that scores every episode, and
    data.truncation=left. (One run for all of it: each run of apps.train costs ~1.5 min of CI.)"""
    (tmp_path / "tools.yaml").write_text(VERL_TOOLS)
    (tmp_path / "reward.py").write_text(REWARD)
    val = tmp_path / "val.parquet"
    write_parquet([validate_row(r, f"val {i}") for i, r in enumerate(arithmetic.make_rows(6, seed=4, split="val"))], val)
    common = (f"data.val_files={val}", "trainer.val_before_train=true", "trainer.test_freq=2",
              "trainer.log_val_generations=2",
              f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tmp_path / 'tools.yaml'}",
              f"custom_reward_function.path={tmp_path / 'reward.py'}",
              "custom_reward_function.reward_kwargs={base: 0.5}", "data.truncation=left")
    proc, run_dir = _train(tmp_path, tiny_model_dir, train_rows, "stream.enabled=true", "stream.max_staleness=1",
                           f"trainer.validation_data_dir={tmp_path / 'dumps'}",
                           f"trainer.rollout_data_dir={tmp_path / 'rollouts'}", *common)
    # streaming: the three training steps, the user's reward function, the bias metrics; nothing abandoned
    steps = check_run(run_dir, tmp_path / "mlruns.db")
    assert all(row["reward/mean"] == 0.75 and row["reward/acc"] == 1.0 for row in steps)  # the user's function
    # the second tool's schema makes every prompt longer than max_prompt_length (256): cut from the left, said once
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "data.truncation=left: row" in line]
    assert len(said) == 1 and "cut to 256" in said[0], said
    for row in steps:
        assert 0 <= row["long_share/trained"] <= 1 and row["tokens/generated_per_trained"] > 0
        assert row["groups/aborted_in_flight"] == 0 and row["staleness/token_mean"] <= row["staleness/max"]
    assert "tandem-rl run summary" in proc.stdout
    # validation: before (step 0), at step 2, and after the last step
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [int(row["step"]) for row in lines] == [0, 1, 2, 3]
    core = "val-core/tandem/arithmetic/hard/acc/mean@1"
    assert [core in row for row in lines] == [True, False, True, True]  # before, every 2 steps, and the last
    assert all("val-aux/num_turns/mean" in row for row in lines if core in row)
    assert sorted(p.name for p in (tmp_path / "dumps").iterdir()) == ["0.jsonl", "2.jsonl", "3.jsonl"]
    dump = [json.loads(line) for line in (tmp_path / "dumps" / "3.jsonl").read_text().splitlines()]
    assert len(dump) == 6 and set(dump[0]) == {"input", "output", "gts", "score", "step", "reward", "acc"}
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["1.jsonl", "2.jsonl", "3.jsonl"]
    assert proc.stdout.count("validation @ step") == 3 and "held-out val-core/" in proc.stdout
    # the run dir keeps the resolved config: val_only from it alone (none of the options above repeated) evaluates
    # the final adapter (policy version 0 of that run) and writes one validation row
    final = run_dir / "adapters" / "v3"
    (tmp_path / "eval").mkdir()
    run2 = tmp_path / "eval" / "run"
    resolved = (run_dir / "config.yaml").read_text()
    assert str(tmp_path / "reward.py") in resolved and "truncation: left" in resolved
    proc2 = subprocess.run(
        [sys.executable, "-m", "apps.train", "--config", str(run_dir / "config.yaml"), "trainer.val_only=true",
         f"trainer.validation_data_dir={tmp_path / 'dumps2'}", f"trainer.default_local_dir={run2}",
         f"actor_rollout_ref.model.lora_adapter_path={final}"],
        cwd=tmp_path / "eval", env={**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
                                    "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=600)
    assert proc2.returncode == 0, proc2.stdout[-3000:] + proc2.stderr[-6000:]
    assert (run2 / "config-val_only.yaml").is_file() and (run_dir / "config.yaml").read_text() == resolved
    rows2 = [json.loads(line) for line in (run2 / "metrics.jsonl").read_text().splitlines()]
    assert [int(row["step"]) for row in rows2] == [0] and core in rows2[0]
    assert not (run2 / "adapters").exists()  # nothing trained
    # greedy validation of the same adapter gives the same outputs as the run's last validation
    again = [json.loads(line) for line in (tmp_path / "dumps2" / "0.jsonl").read_text().splitlines()]
    assert [r["output"] for r in again] == [r["output"] for r in dump]
