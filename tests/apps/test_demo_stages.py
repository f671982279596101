"""The demo's GRPO stage: an interrupted run is not marked done and the next `make demo` resumes it in place; a run
of another config starts over; a finished one is shown from its files."""

from __future__ import annotations

import json

import pytest

from apps import demo
from configs import load_config

pytestmark = pytest.mark.unit


def test_an_interrupted_grpo_stage_is_resumed_not_cached_and_not_deleted(tmp_path, monkeypatch, capsys):
    import apps.train

    cfg = load_config(None, [f"trainer.default_local_dir={tmp_path / 'run'}"])
    codes = iter([130, 0, 0])
    seen = []

    def fake_run(config):
        seen.append(sorted(p.name for p in (tmp_path / "run").iterdir()))
        (tmp_path / "run" / "ray_train").mkdir(exist_ok=True)  # the checkpoint the interrupted run left
        (tmp_path / "run" / "metrics.jsonl").write_text(json.dumps({"step": 1, "groups/trained": 2.0}) + "\n")
        return next(codes)
    monkeypatch.setattr(apps.train, "run", fake_run)
    assert demo.grpo(cfg, "sft-key") == 130  # Ctrl-C
    assert not (tmp_path / "run" / ".tandem-stage").exists()  # not marked done
    assert demo.grpo(cfg, "sft-key") == 0  # the next make demo
    assert "ray_train" in seen[1]  # resumed in place: the checkpoint was kept
    assert "resuming the interrupted run" in capsys.readouterr().out
    assert (tmp_path / "run" / ".tandem-stage").exists()
    assert demo.grpo(cfg, "sft-key") == 0 and len(seen) == 2  # finished: shown from its files, not rerun
    assert demo.grpo(cfg, "another-cold-start") == 0 and seen[2] == [".tandem-stage-started"]  # started over
