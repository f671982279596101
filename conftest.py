"""Repository-wide pytest hooks: gpu tests skip themselves with a reason when no GPU is present."""

import pytest


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or _has_cuda():  # importing torch costs seconds: only when needed
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine); run on a GPU machine")
    for item in gpu_items:
        item.add_marker(skip)
