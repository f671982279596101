"""Fixtures for agent-loop tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir)


@pytest.fixture(scope="session")
def insurance_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agents.data.insurance_db import build_insurance_db

    return build_insurance_db(tmp_path_factory.mktemp("sqldb") / "insurance.sqlite")
