"""Config loading: verl keys, overrides, unknown-key suggestions, unimplemented-key warnings."""

import re
import warnings
from pathlib import Path

import pytest

from configs import ConfigError, ConfigWarning, TandemConfig, load_config

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def _quiet_load(source, overrides=()):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        return load_config(source, overrides)


@pytest.mark.parametrize("name", ["sql_agent_qwen25_coder.yaml", "gsm8k_tool_agent.yaml", "demo_cpu.yaml"])
def test_shipped_configs_load(name):
    cfg = _quiet_load(ROOT / "configs" / name)
    assert isinstance(cfg, TandemConfig)


def test_seed_config_values():
    cfg = _quiet_load(ROOT / "configs" / "sql_agent_qwen25_coder.yaml")
    arr = cfg.actor_rollout_ref
    assert arr.model.path == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert arr.model.override_config == {"attn_implementation": "sdpa"}
    assert (arr.actor.clip_low, arr.actor.clip_high) == (0.2, 0.28)
    assert arr.rollout.engine_kwargs["vllm"]["tool_call_parser"] == "qwen25_coder"
    assert arr.rollout.engine_kwargs["vllm"]["num_gpu_blocks_override"] == 256
    assert cfg.trainer.logger == ["console", "wandb"]
    assert cfg.max_model_len == 8192
    assert cfg.data.return_raw_chat is True and arr.rollout.mode == "async"


def test_seed_config_warnings_name_the_keys():
    with pytest.warns(ConfigWarning) as record:
        load_config(ROOT / "configs" / "sql_agent_qwen25_coder.yaml")
    text = "\n".join(str(w.message) for w in record)
    assert "ppo_mini_batch_size=16" in text
    assert "tool_call_parser=qwen25_coder" in text


def test_typo_names_path_and_suggests():
    with pytest.raises(ConfigError) as err:
        _quiet_load(ROOT / "configs" / "sql_agent_qwen25_coder.yaml", ["actor_rollout_ref.actor.clip_ratio_hgh=0.3"])
    msg = str(err.value)
    assert "actor_rollout_ref.actor.clip_ratio_hgh" in msg
    assert "did you mean actor_rollout_ref.actor.clip_ratio_high" in msg


def test_typo_in_nested_yaml_dict():
    with pytest.raises(ConfigError, match=r"data\.max_promt_length; did you mean data\.max_prompt_length"):
        load_config({"data": {"max_promt_length": 10}})


def test_overrides_parse_like_yaml_scalars():
    cfg = load_config(None, [
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.optim.lr=3e-6",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "trainer.logger=[console,mlflow]",
        "data.val_files=null",
        "+trainer.experiment_name=abc",
    ])
    arr = cfg.actor_rollout_ref
    assert arr.rollout.n == 8
    assert arr.actor.optim.lr == pytest.approx(3e-6)
    assert arr.actor.use_kl_loss is True
    assert cfg.trainer.logger == ["console", "mlflow"]
    assert cfg.data.val_files is None
    assert cfg.trainer.experiment_name == "abc"


def test_bad_override_shape():
    with pytest.raises(ConfigError, match="dotted.key=value"):
        load_config(None, ["actor_rollout_ref.rollout.n"])


def test_unimplemented_verl_key_warns_once_and_loads():
    with pytest.warns(ConfigWarning) as record:
        cfg = load_config({"trainer": {"critic_warmup": 0, "balance_batch": True}, "critic": {"ppo_epochs": 1}})
    messages = [str(w.message) for w in record]
    # one warning per section that has any, naming its keys (verl's full config has hundreds)
    assert [m for m in messages if m.startswith("trainer:")] == [
        "trainer: verl keys accepted but not implemented by tandem-rl; ignored: critic_warmup, balance_batch"]
    assert sum(m.endswith("ignored: critic") for m in messages) == 1
    assert cfg.trainer.experiment_name == "run"


def test_sync_mode_is_explained():
    with pytest.raises(ConfigError, match="always server-based and asynchronous"):
        load_config(None, ["actor_rollout_ref.rollout.mode=sync"])


def test_defaults_are_async_and_raw_chat():
    cfg = load_config(None)
    assert cfg.actor_rollout_ref.rollout.mode == "async"
    assert cfg.data.return_raw_chat is True


def test_max_model_len_must_fit_prompt_and_response():
    with pytest.raises(ConfigError, match=r"max_model_len=1000 is smaller than .* = 1536"):
        load_config(None, ["data.max_prompt_length=1024", "data.max_response_length=512",
                           "actor_rollout_ref.rollout.max_model_len=1000"])


def test_mini_batch_must_divide_batch():
    with pytest.raises(ConfigError, match="not a multiple"):
        load_config(None, ["data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=4"])


def test_mini_batch_larger_than_batch_warns():
    with pytest.warns(ConfigWarning, match="whole batch as one mini-batch"):
        load_config(None, ["data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4"])


def test_bounds_are_enforced_with_path():
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.rollout\.n: Input should be greater than or equal to 1"):
        load_config(None, ["actor_rollout_ref.rollout.n=0"])
    with pytest.raises(ConfigError, match=r"data\.truncation"):
        load_config(None, ["data.truncation=sideways"])


def test_grpo_needs_a_group():
    with pytest.raises(ConfigError, match="rollout.n >= 2"):
        load_config(None, ["actor_rollout_ref.rollout.n=1"])


def test_references_resolve():
    cfg = load_config({"data": {"max_prompt_length": 300},
                       "actor_rollout_ref": {"rollout": {"prompt_length": "${data.max_prompt_length}"}}})
    assert cfg.actor_rollout_ref.rollout.prompt_length == 300


def test_every_field_is_documented():
    def walk(cls):
        for name, field in cls.model_fields.items():
            assert field.description, f"{cls.__name__}.{name} has no docstring"
            sub = field.annotation
            if isinstance(sub, type) and hasattr(sub, "model_fields"):
                walk(sub)
    walk(TandemConfig)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml does not exist"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.unit
@pytest.mark.parametrize("overrides, named", [
    (["trainer.test_freq=5"], "trainer.test_freq=5"),
    (["trainer.val_before_train=true"], "trainer.val_before_train"),
    (["trainer.val_only=true", "trainer.test_freq=2"], "trainer.test_freq=2 and trainer.val_only"),
])
def test_validation_without_val_files_names_both_keys(overrides, named):
    with pytest.raises(ConfigError, match=re.escape(named) + ".*need data.val_files"):
        load_config(None, overrides)


@pytest.mark.unit
def test_validation_keys_load_and_lr_zero_is_a_control():
    cfg = load_config(None, ["data.val_files=v.parquet", "trainer.test_freq=3", "trainer.val_only=true",
                             "trainer.log_val_generations=2", "trainer.validation_data_dir=out/val",
                             "trainer.rollout_data_dir=out/roll", "actor_rollout_ref.model.lora_adapter_path=a/v3",
                             "actor_rollout_ref.actor.optim.lr=0", "data.val_batch_size=16",
                             "actor_rollout_ref.rollout.val_kwargs.n=4"])
    assert (cfg.trainer.test_freq, cfg.trainer.val_only, cfg.trainer.log_val_generations) == (3, True, 2)
    assert cfg.actor_rollout_ref.model.lora_adapter_path == "a/v3" and cfg.actor_rollout_ref.actor.optim.lr == 0.0
    with pytest.raises(ConfigError, match="optim.lr"):
        load_config(None, ["actor_rollout_ref.actor.optim.lr=-1e-4"])


def test_the_agent_lightning_loop_needs_a_server_and_an_agent_class():
    with pytest.raises(ConfigError, match="agent_lightning.server_url .* agent_lightning.agent_class"):
        load_config("configs/demo_cpu.yaml", ["actor_rollout_ref.rollout.agent.default_agent_loop=agent_lightning"])
    cfg = load_config("configs/demo_cpu.yaml", [
        "actor_rollout_ref.rollout.agent.default_agent_loop=agent_lightning",
        "agent_lightning.server_url=http://127.0.0.1:8181", "agent_lightning.agent_class=pkg.mod.Agent",
        "agent_lightning.env_map={QUESTION: input.question}"])
    assert cfg.agent_lightning.env_map == {"QUESTION": "input.question"} and cfg.agent_lightning.timeout_s == 600


def test_agent_lightning_with_a_token_on_the_ingress_is_refused_since_its_proxy_sends_none():
    agl = ["agent_lightning.server_url=http://127.0.0.1:8181", "agent_lightning.agent_class=pkg.mod.Agent"]
    with pytest.raises(ConfigError, match="serve.api_key_env=TANDEM_KEY .* forwards agents' calls without any "
                                          "Authorization header"):
        load_config("configs/demo_cpu.yaml", [*agl, "serve.api_key_env=TANDEM_KEY"])
    assert load_config("configs/demo_cpu.yaml", [*agl, "agent_lightning.api_key_env=AGL_KEY"]).serve.api_key_env is None


def test_agent_lightning_0_3_store_is_the_other_way_and_server_settings_beside_it_are_warned_or_refused():
    loop = "actor_rollout_ref.rollout.agent.default_agent_loop=agent_lightning"
    cfg = load_config("configs/demo_cpu.yaml", [loop, "agent_lightning.store_url=http://localhost:4747"])
    assert cfg.agent_lightning.store_url == "http://localhost:4747"
    with pytest.warns(ConfigWarning, match="agent_lightning.env_map, agent_lightning.model_name: settings of a 1.x"):
        load_config("configs/demo_cpu.yaml", [loop, "agent_lightning.store_url=http://localhost:4747",
                                              "agent_lightning.model_name=m", "agent_lightning.env_map={A: input.a}"])
    with pytest.raises(ConfigError, match="two ways to reach Agent Lightning: set one"):
        load_config("configs/demo_cpu.yaml", ["agent_lightning.store_url=http://localhost:4747",
                                              "agent_lightning.agent_class=pkg.mod.Agent"])
