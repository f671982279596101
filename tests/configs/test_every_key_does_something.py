"""Every config key is implemented, warned about, or rejected: none is silently ignored.

Walks every leaf field of the schema. A field passes when the code outside configs/ reads it, or its section lists
it as having no effect (a non-default value loads with a warning: checked here) or as default-only (a non-default
value is rejected: checked here), or it is enforced by a config rule listed below with a value that must change
the loaded config or be rejected (checked here). A new field that none of these covers fails this test."""

from __future__ import annotations

import re
import typing
import warnings
from pathlib import Path

import pytest

from configs import ConfigError, ConfigWarning, load_config
from configs.loader import _section_type
from configs.schema import TandemConfig

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
CODE = "\n".join(p.read_text() for d in ("agents", "apps", "deployments", "trainers", "orchestration", "observability") for p in (ROOT / d).rglob("*.py"))

# fields enforced by a config rule: an override, and what it must do (an error, or a property it changes)
ENFORCED = {
    "algorithm.adv_estimator": ("gae", None),
    "algorithm.use_kl_in_reward": ("true", None),
    "data.return_raw_chat": ("false", None),
    "actor_rollout_ref.actor.ppo_micro_batch_size": ("3", lambda c: c.actor_rollout_ref.actor.micro_batch_size == 3),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": ("5", lambda c: c.actor_rollout_ref.actor.micro_batch_size == 5),
    "actor_rollout_ref.actor.clip_ratio_low": ("0.1", lambda c: c.actor_rollout_ref.actor.clip_low == 0.1),
    "actor_rollout_ref.actor.clip_ratio_high": ("0.4", lambda c: c.actor_rollout_ref.actor.clip_high == 0.4),
    "actor_rollout_ref.rollout.mode": ("sync", None),
    "actor_rollout_ref.rollout.prompt_length": ("77", None),  # must agree with data.max_prompt_length
    "actor_rollout_ref.rollout.response_length": ("77", None),
    # the opt-out of the public-bind rule (tests/deployments/test_access.py): loads, and is what lets 0.0.0.0 load
    "serve.allow_public_without_key": ("true", lambda c: load_config(None, ["serve.host=0.0.0.0",
                                                                            "serve.allow_public_without_key=true"])),
}


def leaves(cls=TandemConfig, prefix=""):
    for name, field in cls.model_fields.items():
        sub = _section_type(field.annotation)
        if sub is not None:
            yield from leaves(sub, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", name, cls, field


def _other_value(field) -> str:
    """An override value different from the field's default, by its type."""
    default = field.get_default(call_default_factory=True)
    if isinstance(default, bool):
        return str(not default).lower()
    if isinstance(default, str):
        choices = [a for a in typing.get_args(field.annotation) if isinstance(a, str) and a != default]
        return choices[0] if choices else "something_else"
    if isinstance(default, float):
        return str(default / 2 if default else 0.5)
    return "7"


@pytest.mark.parametrize("path,name,cls,field", list(leaves()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_field_is_read_warned_or_rejected(path, name, cls, field):
    if name in cls.NO_EFFECT:
        with pytest.warns(ConfigWarning, match=re.escape(f"{path}=") + ".*has no effect"):
            load_config(None, [f"{path}={_other_value(field)}"])
    elif name in cls.ONLY_DEFAULT:
        with pytest.raises(ConfigError, match=re.escape(f"{path}=") + ".*is not supported"):
            load_config(None, [f"{path}={_other_value(field)}"])
    elif path in ENFORCED:
        value, changed = ENFORCED[path]
        if changed is None:
            with pytest.raises(ConfigError):
                load_config(None, [f"{path}={value}"])
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConfigWarning)
                assert changed(load_config(None, [f"{path}={value}"]))
    else:
        assert re.search(rf"\.{name}\b|[\"']{name}[\"']", CODE), (
            f"{path} is accepted but nothing outside configs/ reads it: implement it, or list it in its section's "
            "NO_EFFECT (warned) or ONLY_DEFAULT (rejected)")
