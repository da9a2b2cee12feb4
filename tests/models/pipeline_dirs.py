"""The pipeline loaders' refusals of what is not a whole pipeline folder, shared by the families' loader tests."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from vgrpo.models.pipeline import PipelineError


def assert_loader_names_the_missing_piece(
    load: Callable[[Path], object], saved: Path, tmp_path: Path, component: str
) -> Path:
    """``load`` refuses a folder that is not there, an empty one and ``tmp_path/broken`` (a copy of the pipeline
    ``saved`` without its ``component`` folder), each with a :class:`PipelineError` naming the folder and what it
    lacks; returns the broken copy."""
    with pytest.raises(PipelineError, match="pipeline directory not found"):
        load(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PipelineError, match=r"empty: no model_index\.json"):
        load(tmp_path / "empty")
    broken = tmp_path / "broken"
    shutil.copytree(saved, broken)
    shutil.rmtree(broken / component)
    with pytest.raises(PipelineError, match=rf"broken: component folder {component}/ is missing"):
        load(broken)
    return broken
