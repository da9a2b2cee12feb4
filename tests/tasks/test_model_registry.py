"""A stage's registered model, consumed with plain MLflow: ``mlflow.pyfunc.load_model(uri).predict(prompts)``.

The model is logged by :func:`tasks.callbacks.log_adapter_model` (what a curriculum stage logs) into a SQLite
store under ``tmp_path``; the images ``predict`` returns are compared with the base + LoRA sampled by diffusers
itself from the same global seed.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

mlflow = pytest.importorskip("mlflow")

from diffusers import StableDiffusion3Pipeline  # noqa: E402
from mlflow import MlflowClient  # noqa: E402
from PIL import Image  # noqa: E402

from tasks.callbacks import Sampling, log_adapter_model, model_alias  # noqa: E402
from tests.models.embedded_lora import BASE, saved_lora_transformer  # noqa: E402

PROMPTS = ["a red cube left of a blue ball", "the word STOP on a sign"]


@pytest.fixture
def tracking(tmp_path: Path) -> Iterator[str]:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    before = mlflow.get_tracking_uri()
    yield uri
    mlflow.set_tracking_uri(before)


def _pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def test_a_registered_stage_model_predicts_with_plain_pyfunc(tracking: str, tmp_path: Path) -> None:
    client = MlflowClient(tracking)
    experiment = client.create_experiment("tiny", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id
    lora = tmp_path / "lora"
    saved_lora_transformer(lora)
    sampling = Sampling(num_inference_steps=3)
    uri = log_adapter_model(client, run_id, lora, BASE, "tiny", stage="s1-preference", sampling=sampling)
    client.set_terminated(run_id)
    assert uri is not None

    version = client.get_model_version_by_alias("tiny", "s1-preference")
    assert version.run_id == run_id and version.tags["vgrpo.training.stage"] == "s1-preference"

    model = mlflow.pyfunc.load_model("models:/tiny@s1-preference")
    torch.manual_seed(0)
    images = [_pixels(png) for png in model.predict(PROMPTS)]
    pipe = StableDiffusion3Pipeline.from_pretrained(BASE)
    side = pipe.default_sample_size * pipe.vae_scale_factor
    assert [im.shape for im in images] == [(side, side, 3)] * 2  # the base's own side, not the flavour's 512

    # The same call in diffusers by hand: base, LoRA, the logged defaults (no CFG, 3 steps), the same seed.
    pipe.load_lora_weights(lora)
    torch.manual_seed(0)
    expected = pipe(PROMPTS, num_inference_steps=3, guidance_scale=1.0, height=side, width=side).images
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(images, expected, strict=True))
    torch.manual_seed(0)
    base_only = StableDiffusion3Pipeline.from_pretrained(BASE)(PROMPTS, num_inference_steps=3, guidance_scale=1.0)
    assert np.abs(images[0].astype(int) - np.asarray(base_only.images[0]).astype(int)).mean() > 0.5  # LoRA matters


@pytest.mark.parametrize(
    ("stage", "alias"), [("s1-preference", "s1-preference"), ("stage 2/ocr", "stage-2-ocr"), ("v3", "stage-v3")]
)
def test_model_alias(stage: str, alias: str) -> None:
    assert model_alias(stage) == alias
