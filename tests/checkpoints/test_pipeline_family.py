"""A pipeline folder's components belong to the family its pipeline class names (vgrpo/checkpoints/weight_files.py,
``family_problems``): a FLUX transformer in an SD3 folder, a transformer class model_index.json gives that is not
the family's, or another family's VAE is named with the file at fault before anything loads (``vgrpo evaluate``
exits 2 without diffusers' shape traceback and writes nothing); every family's tiny pipeline passes."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.tiny_world import write_tiny_world
from vgrpo.checkpoints.weight_files import pipeline_problems
from vgrpo.cli import main
from vgrpo.models.tiny import tiny_flux_pipeline, tiny_qwen_image_pipeline, tiny_z_image_pipeline
from vgrpo.models.tiny_flux2 import tiny_flux2_pipeline
from vgrpo.models.tiny_flux_kontext import tiny_flux_kontext_pipeline
from vgrpo.models.tiny_wan import tiny_wan_pipeline

TINY_PIPELINES: dict[str, Callable[[], Any]] = {
    "flux": tiny_flux_pipeline,
    "flux-kontext": tiny_flux_kontext_pipeline,
    "z-image": tiny_z_image_pipeline,
    "qwen-image": tiny_qwen_image_pipeline,
    "flux2": tiny_flux2_pipeline,
    "wan": tiny_wan_pipeline,
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny world (its ``base``: the embedded SD3 pipeline) and every other family's tiny pipeline, saved."""
    root = write_tiny_world(tmp_path_factory.mktemp("families"))
    for name, build in TINY_PIPELINES.items():
        build().save_pretrained(root / name)
    return root


def _mixed(folders: Path, into: str, component: str, source: str, dest: Path) -> Path:
    """A copy of the ``into`` pipeline with its ``component`` folder taken from the ``source`` pipeline."""
    shutil.copytree(folders / into, dest)
    shutil.rmtree(dest / component)
    shutil.copytree(folders / source / component, dest / component)
    return dest


def test_every_familys_tiny_pipeline_is_coherent(folders: Path) -> None:
    for name in ("base", *TINY_PIPELINES):
        assert pipeline_problems(folders / name) == [], name


def test_a_component_of_another_family_is_named(folders: Path, tmp_path: Path) -> None:
    sd3 = _mixed(folders, "base", "transformer", "flux", tmp_path / "sd3-with-flux-transformer")
    assert pipeline_problems(sd3) == [
        f"{sd3}/transformer/config.json: _class_name is FluxTransformer2DModel (the flux family's), but "
        "StableDiffusion3Pipeline (the sd3 family) takes SD3Transformer2DModel as transformer"
    ]
    index = json.loads((sd3 / "model_index.json").read_text())
    (sd3 / "model_index.json").write_text(json.dumps(index | {"transformer": ["diffusers", "FluxTransformer2DModel"]}))
    (problem,) = [p for p in pipeline_problems(sd3) if "model_index.json" in p]
    assert problem == (
        f"{sd3}/model_index.json: transformer is FluxTransformer2DModel (the flux family's), but "
        "StableDiffusion3Pipeline (the sd3 family) holds SD3Transformer2DModel"
    )
    flux = _mixed(folders, "flux", "vae", "qwen-image", tmp_path / "flux-with-qwen-vae")
    assert pipeline_problems(flux) == [
        f"{flux}/vae/config.json: _class_name is AutoencoderKLQwenImage, but FluxPipeline (the flux family) takes "
        "AutoencoderKL as vae"
    ]


def test_evaluate_refuses_a_mixed_pipeline_before_loading_it(
    folders: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sd3 = _mixed(folders, "base", "transformer", "flux", tmp_path / "mixed")
    out = tmp_path / "eval.json"
    args = ["--prompts", str(folders / "test.jsonl"), "--out", str(out), "--set", "rewards=[{name: geneval}]"]
    args += ["group_size=1", "num_steps=1", "max_prompts=1"]
    assert main(["evaluate", str(sd3), *args]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"{sd3}/transformer/config.json: _class_name is FluxTransformer2DModel" in err
    assert not out.exists()
    assert main(["evaluate", str(folders / "base"), *args]) == 0 and out.is_file()
