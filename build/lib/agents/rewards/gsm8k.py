"""GSM8K reward: verl's ``reward_score.gsm8k.compute_score`` as a pure function (agents layer).

Importing ``verl.utils.reward_score.gsm8k`` the normal way runs ``verl/__init__``, which imports
torch and ray (about 5 s, and the agents layer is torch-free). The scorer itself is a standalone
module that only needs ``re``, so it is loaded straight from verl's installed file. A process that
already imported it the normal way (a trainer) reuses that module.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Literal

_VERL_MODULE = "verl.utils.reward_score.gsm8k"


def _load_verl_gsm8k() -> ModuleType:
    if _VERL_MODULE in sys.modules:
        return sys.modules[_VERL_MODULE]
    spec = importlib.util.find_spec("verl")  # locates the package without executing verl/__init__
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the GSM8K reward needs verl installed (verl.utils.reward_score.gsm8k)")
    path = Path(spec.submodule_search_locations[0]) / "utils" / "reward_score" / "gsm8k.py"
    file_spec = importlib.util.spec_from_file_location("_tandem_verl_gsm8k", path)
    if file_spec is None or file_spec.loader is None:
        raise ImportError(f"cannot load verl's GSM8K scorer from {path}")
    module = importlib.util.module_from_spec(file_spec)
    file_spec.loader.exec_module(module)
    return module


_verl_gsm8k = _load_verl_gsm8k()


def normalize_ground_truth(ground_truth: str | int | float) -> str:
    """The bare number verl compares against: ``'#### 1,200'`` and ``1200`` both become ``'1200'``."""
    text = str(ground_truth).strip()
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip()
    return text.replace(",", "").replace("$", "")


def score(
    solution_str: str,
    ground_truth: str | int | float,
    *,
    method: Literal["strict", "flexible"] = "strict",
    format_score: float = 0.0,
    correct_score: float = 1.0,
) -> float:
    """``correct_score`` if the answer verl extracts equals the ground truth, ``format_score`` if an
    answer was extracted but is wrong, 0.0 if none was. ``strict`` needs ``#### <number>``."""
    return float(
        _verl_gsm8k.compute_score(
            solution_str,
            normalize_ground_truth(ground_truth),
            method=method,
            format_score=format_score,
            score=correct_score,
        )
    )
