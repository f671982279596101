"""Repository-wide pytest hooks: gpu tests skip themselves with a reason when no GPU is present."""

import pytest


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine); run on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
