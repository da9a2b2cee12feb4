"""Shared fixtures: tiny randomly initialised models built from config (no hub, CPU, seconds)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(2)
torch.set_flush_denormal(True)


@pytest.fixture
def tiny_sd3_policy() -> torch.nn.Module:
    from vgrpo.models import SD3Velocity
    from vgrpo.models.tiny import tiny_sd3_transformer

    return SD3Velocity(tiny_sd3_transformer())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``gpu``-marked tests need a CUDA device: skipped without one (``scripts/gpu_check.sh`` runs them)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (gpu marker)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
