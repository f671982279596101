"""Every parser on the golden corpus: the universal one exact, the strict ones exact on their own
format and never inventing a call anywhere."""

from __future__ import annotations

from typing import get_args

import pytest

from agents.parsers import PARSERS, ParserFormat, parse_tool_calls
from tests.agents.parsers.golden_corpus import CORPUS, GoldenCase

STRICT_FORMATS = {"hermes": "hermes", "qwen3_xml": "qwen3_xml"}  # format -> its own corpus variant
# The strict parsers know no code fences: a <tool_call> quoted in a python fence is a call to hermes
# (and a malformed one to qwen3_xml).
FENCE_BLIND_CASE = "neg_tag_in_python_fence"


def _observed(fmt: str, case: GoldenCase) -> tuple[tuple[tuple[str, dict], ...], str, int]:
    parsed = PARSERS[fmt](case.text)
    return tuple((call.name, call.arguments) for call in parsed.calls), parsed.content, len(parsed.errors)


@pytest.mark.unit
def test_parser_table_matches_the_format_literal():
    assert sorted(PARSERS) == sorted(get_args(ParserFormat)) == ["hermes", "qwen25_coder", "qwen3_xml"]


@pytest.mark.unit
def test_corpus_is_large_and_ids_are_unique():
    assert len(CORPUS) >= 40
    assert len({case.case_id for case in CORPUS}) == len(CORPUS)


@pytest.mark.unit
@pytest.mark.parametrize("case", CORPUS, ids=lambda case: case.case_id)
def test_default_parser_is_exact(case: GoldenCase):
    parsed = parse_tool_calls(case.text)
    assert [(call.name, call.arguments) for call in parsed.calls] == list(case.calls)
    assert parsed.content == case.content
    assert len(parsed.errors) == case.errors


@pytest.mark.unit
@pytest.mark.parametrize("fmt", sorted(STRICT_FORMATS))
def test_strict_parser_is_exact_on_its_own_format(fmt: str):
    own = [case for case in CORPUS if case.variant == STRICT_FORMATS[fmt]]
    assert len(own) >= 3
    for case in own:
        assert _observed(fmt, case) == (case.calls, case.content, case.errors), case.case_id


@pytest.mark.unit
@pytest.mark.parametrize("fmt", sorted(PARSERS))
def test_no_parser_invents_a_call(fmt: str):
    for case in CORPUS:
        calls, _, _ = _observed(fmt, case)
        invented = [call for call in calls if call not in case.calls]
        assert bool(invented) == (fmt == "hermes" and case.case_id == FENCE_BLIND_CASE), case.case_id


@pytest.mark.unit
@pytest.mark.parametrize("fmt", sorted(PARSERS))
def test_hard_negatives_are_content_for_every_parser(fmt: str):
    negatives = [case for case in CORPUS if case.variant == "negative"]
    assert len(negatives) >= 8
    for case in negatives:
        if fmt == "qwen25_coder" or case.case_id != FENCE_BLIND_CASE:
            assert _observed(fmt, case) == ((), case.text, 0), case.case_id
