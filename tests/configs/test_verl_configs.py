"""verl's own configs load: OmegaConf interpolation (``${oc.select:…}``, relative ``${.key}``, ``${oc.env:…}``),
Hydra defaults lists composed from the files next to the config, Hydra override forms, and one warning per section
for the verl keys tandem-rl does not implement."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import verl
from omegaconf import OmegaConf

from configs import ConfigError, ConfigWarning, load_config
from configs.loader import _read_file

pytestmark = pytest.mark.unit
VERL_CONFIGS = Path(os.path.dirname(verl.__file__)) / "trainer" / "config"
GENERATED = VERL_CONFIGS / "_generated_ppo_trainer.yaml"


def _load_recording(source, overrides):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cfg = load_config(source, overrides)
    return cfg, [str(w.message) for w in record if issubclass(w.category, ConfigWarning)]


def test_verls_full_config_loads_with_one_warning_per_section():
    cfg, messages = _load_recording(GENERATED, ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4",
                                                "~critic"])
    assert cfg.actor_rollout_ref.rollout.n == 4
    assert cfg.data.train_batch_size == 1024 and cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 256  # verl's
    unimplemented = [m for m in messages if "not implemented by tandem-rl" in m]
    assert 10 <= len(unimplemented) <= 25, unimplemented  # hundreds of keys, grouped by section
    sections = [m.split(":")[0] for m in unimplemented]
    assert len(sections) == len(set(sections))
    assert any(m.startswith("actor_rollout_ref.rollout:") and "cudagraph_capture_sizes" in m for m in unimplemented)
    assert not any(m.endswith("critic") or "critic," in m for m in unimplemented)  # ~critic deleted it


def test_verls_defaults_gae_is_rejected_with_the_fix():
    with pytest.raises(ConfigError, match="'gae': tandem-rl trains critic-free GRPO only.*algorithm.adv_estimator=grpo"):
        _load_recording(GENERATED, [])


def test_composing_verls_ppo_trainer_defaults_list_gives_its_generated_config():
    composed = OmegaConf.to_container(_read_file(VERL_CONFIGS / "ppo_trainer.yaml"), resolve=True)
    generated = OmegaConf.to_container(OmegaConf.load(GENERATED), resolve=True)
    composed.pop("model_engine")  # the group choice, which verl's generator leaves out
    assert composed == generated


def test_hydra_override_forms(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("trainer:\n  seed: 5\n  experiment_name: x\n")
    with pytest.raises(ConfigError, match=r"\+trainer.seed=3.*already set; use trainer.seed=… or \+\+trainer.seed"):
        load_config(config, ["+trainer.seed=3"])
    assert load_config(config, ["++trainer.seed=3"]).trainer.seed == 3
    assert load_config(config, ["+trainer.total_epochs=2"]).trainer.total_epochs == 2
    assert load_config(config, ["~trainer.seed"]).trainer.seed == 1  # deleted: the default
    with pytest.raises(ConfigError, match="cannot delete 'trainer.nope'"):
        load_config(config, ["~trainer.nope"])
    with pytest.raises(ConfigError, match="unknown config key trainer.foo"):
        load_config(config, ["+trainer.foo=1"])  # added, then refused by the schema (typo protection)


def test_omegaconf_interpolations_and_a_missing_defaults_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_TEST_PROJECT", "from-env")
    (tmp_path / "algo").mkdir()
    (tmp_path / "algo" / "mine.yaml").write_text("norm_adv_by_std_in_grpo: false\n")
    config = tmp_path / "c.yaml"
    config.write_text(
        "defaults:\n  - algo@algorithm: mine\n  - data@data: missing\n  - _self_\n"
        "trainer:\n  project_name: ${oc.env:TANDEM_TEST_PROJECT}\n  experiment_name: ${.project_name}-run\n"
        "  total_epochs: ${oc.select:trainer.not_set,3}\n")
    with pytest.warns(ConfigWarning, match=r"defaults entry \{'data@data': 'missing'\}.*does not exist; skipped"):
        cfg = load_config(config)
    assert cfg.trainer.project_name == "from-env" and cfg.trainer.experiment_name == "from-env-run"
    assert cfg.trainer.total_epochs == 3 and cfg.algorithm.norm_adv_by_std_in_grpo is False
    with pytest.raises(ConfigError, match="config reference"):
        load_config({"trainer": {"experiment_name": "${trainer.nowhere}"}})
