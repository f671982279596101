"""apply_prompt_limit: verl's data.truncation modes, checked by hand on small id lists."""

import pytest

from agents.data.truncation import PromptTooLongError, apply_prompt_limit

pytestmark = pytest.mark.unit
IDS = list(range(10))


@pytest.mark.parametrize(
    ("truncation", "limit", "expected"),
    [
        ("left", 4, [6, 7, 8, 9]),
        ("right", 4, [0, 1, 2, 3]),
        ("middle", 4, [0, 1, 8, 9]),
        ("middle", 5, [0, 1, 7, 8, 9]),
        ("middle", 1, [9]),
        ("left", 1, [9]),
        ("right", 1, [0]),
    ],
)
def test_truncation_modes(truncation, limit, expected):
    assert apply_prompt_limit(IDS, limit, truncation, row_index=0) == expected


@pytest.mark.parametrize("truncation", ["error", "left", "right", "middle"])
@pytest.mark.parametrize("limit", [10, 11])
def test_prompt_within_limit_is_unchanged(truncation, limit):
    assert apply_prompt_limit(IDS, limit, truncation, row_index=3) == IDS


def test_error_mode_names_row_and_lengths():
    with pytest.raises(PromptTooLongError) as info:
        apply_prompt_limit([1] * 9120, 8192, "error", row_index=17)
    assert str(info.value) == "row 17: prompt has 9120 tokens, max_prompt_length is 8192"


def test_unknown_mode_and_bad_limit_are_rejected():
    with pytest.raises(ValueError, match="error\\|left\\|right\\|middle"):
        apply_prompt_limit(IDS, 4, "center", row_index=0)
    with pytest.raises(ValueError, match="max_prompt_length must be >= 1"):
        apply_prompt_limit(IDS, 0, "left", row_index=0)
