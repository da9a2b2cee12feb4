"""Fixtures of the model tests: a tiny FluxPipeline built offline, saved once per module and loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vgrpo.models.pipeline import load_pipeline
from vgrpo.models.tiny import tiny_flux_pipeline


@pytest.fixture(scope="module")
def saved_flux(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("flux") / "pipeline"
    tiny_flux_pipeline(seed=0).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def flux(saved_flux: Path) -> Any:
    return load_pipeline(saved_flux)
