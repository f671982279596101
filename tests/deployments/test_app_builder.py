"""The rollout app builder: ``serve_config.yaml``, builder args from a ``TandemConfig``, ``deploy_rollout_app``."""

from __future__ import annotations

import warnings

import pytest
import yaml
from pydantic import ValidationError

from deployments.rollout_app import RolloutAppArgs, args_from_config
from configs import ConfigWarning, load_config
from tests.deployments.conftest import ROOT

SERVE_CONFIG = ROOT / "serve_config.yaml"


def _config(*overrides: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        return load_config(None, overrides)


@pytest.mark.unit
def test_serve_config_yaml_deploys_the_rollout_builder_on_localhost():
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    assert config["http_options"]["host"] == "127.0.0.1"
    [app] = config["applications"]
    assert app["import_path"] == "apps.rollout:build_app"
    args = RolloutAppArgs.model_validate(app["args"])
    assert (args.model, args.engine, args.parser) == (".cache/tiny-model", "hf", "qwen25_coder")
    rollout = {d["name"]: d for d in app["deployments"]}["RolloutServer"]
    autoscaling = rollout["autoscaling_config"]
    assert autoscaling["min_replicas"] <= autoscaling["max_replicas"]
    assert autoscaling["target_ongoing_requests"] > 0
    assert 0 < rollout["ray_actor_options"]["num_cpus"] < 1


@pytest.mark.unit
def test_builder_args_reject_inverted_replica_bounds_and_unknown_keys():
    with pytest.raises(ValidationError, match="min_replicas=3 > max_replicas=2"):
        RolloutAppArgs(min_replicas=3, max_replicas=2)
    with pytest.raises(ValidationError):
        RolloutAppArgs.model_validate({"modle": "x"})
    with pytest.raises(ValidationError, match="max_model_len"):
        RolloutAppArgs(engine_kwargs={"max_model_len": 10})


@pytest.mark.unit
def test_args_from_config_hf():
    cfg = _config(
        "serve.min_replicas=2", "serve.max_replicas=4", "serve.num_cpus_per_replica=0.5",
        "serve.target_ongoing_requests=8", "serve.api_key_env=MY_KEY", "actor_rollout_ref.rollout.max_num_seqs=12",
        "actor_rollout_ref.rollout.multi_turn.format=hermes", "data.max_prompt_length=100",
        "data.max_response_length=28",
    )
    args = args_from_config(cfg)
    assert (args.engine, args.parser, args.max_model_len) == ("hf", "hermes", 128)
    assert (args.min_replicas, args.max_replicas, args.num_cpus, args.target_ongoing_requests) == (2, 4, 0.5, 8.0)
    assert args.api_key_env == "MY_KEY"
    assert args.engine_kwargs == {"max_batch_size": 12, "swap": "interrupt"}  # streaming: partial rollouts


@pytest.mark.unit
@pytest.mark.parametrize("overrides", [["stream.enabled=false"], ["stream.partial_rollout=false"]])
def test_args_from_config_hf_drains_on_swap_without_partial_rollouts(overrides):
    assert args_from_config(_config(*overrides)).engine_kwargs["swap"] == "drain"


@pytest.mark.unit
def test_an_unknown_hf_engine_kwarg_is_rejected_before_any_replica_starts():
    from deployments.rollout_app import build_app

    with pytest.raises(ValueError, match=r"\['prefix_cache_entries'\]: not options of the hf engine.*prefix_cache_mib"):
        build_app(RolloutAppArgs(engine_kwargs={"prefix_cache_entries": 4, "prefix_cache_mib": 64}))
    cfg = _config("+actor_rollout_ref.rollout.engine_kwargs.hf.prefix_cache_mib=64")
    assert args_from_config(cfg).engine_kwargs["prefix_cache_mib"] == 64


@pytest.mark.unit
def test_args_from_config_vllm_passes_engine_kwargs_through():
    cfg = _config(
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.gpu_memory_utilization=0.7",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.enforce_eager=true",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.num_gpu_blocks_override=64",
        "serve.num_gpus_per_replica=1",
    )
    args = args_from_config(cfg)
    assert args.engine == "vllm" and args.num_gpus == 1.0
    kwargs = args.engine_kwargs
    assert kwargs["gpu_memory_utilization"] == 0.7 and kwargs["max_num_seqs"] == 256
    assert kwargs["enforce_eager"] is True and kwargs["num_gpu_blocks_override"] == 64
    assert kwargs["max_lora_rank"] == 16


@pytest.mark.integration
@pytest.mark.slow
def test_deploy_rollout_app_from_a_config(rollout_app, tiny_model_dir):
    # ``rollout_app`` first: Serve is then already running on the session's port (the config's 8000 may be taken).
    from ray import serve

    from agents.records import GenerateRequest, SamplingParams
    from deployments.rollout_app import deploy_rollout_app

    port = int(rollout_app.base_url.split(":")[-1].split("/")[0])
    cfg = _config(
        f"actor_rollout_ref.model.path={tiny_model_dir}", "serve.app_name=cfg-app", "serve.route_prefix=/cfg",
        f"serve.port={port}", "serve.num_cpus_per_replica=0.5", "actor_rollout_ref.rollout.max_num_seqs=8",
    )
    handle = deploy_rollout_app(cfg)
    try:
        result = handle.generate.remote(GenerateRequest((1, 2, 3), SamplingParams(max_new_tokens=3))).result()
        assert 1 <= len(result.token_ids) <= 3 and result.policy_version == 0
    finally:
        serve.delete("cfg-app")
