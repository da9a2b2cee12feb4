"""Merge-and-export (``python -m vgrpo.cli export``): the merged pipeline computes what base + LoRA computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.models.test_embedded import TINY
from vgrpo.checkpoints.state import save_lora
from vgrpo.cli import main
from vgrpo.models import add_lora
from vgrpo.models.config import LoraConfig
from vgrpo.models.embedded import build_pipeline, train_clip_tokenizer
from vgrpo.models.pipeline import load_sd3_pipeline

TARGETS = LoraConfig().target_modules


@pytest.fixture(scope="module")
def base_and_lora(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("export")
    config = TINY.model_copy(update={"num_layers": 2})  # a last layer without context output has no to_add_out
    tokenizer = train_clip_tokenizer(["a red circle", "two blue squares", ""], config)
    build_pipeline(config, tokenizer, seed=0).save_pretrained(root / "base")
    transformer = load_sd3_pipeline(root / "base").transformer
    add_lora(transformer, rank=4, alpha=8, target_modules=TARGETS)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # a trained-looking adapter: B away from its zero init
        for name, p in transformer.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    save_lora(transformer, root / "lora")
    return root / "base", root / "lora"


def _velocity(transformer: torch.nn.Module) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    kw = {
        "hidden_states": torch.randn(2, 4, 8, 8, generator=g),
        "encoder_hidden_states": torch.randn(2, 20, 32, generator=g),
        "pooled_projections": torch.randn(2, 16, generator=g),
        "timestep": torch.tensor([700.0, 200.0]),
    }
    with torch.no_grad():
        return transformer(**kw).sample


def test_export_merges_the_adapter_into_a_plain_pipeline(base_and_lora: tuple[Path, Path], tmp_path: Path) -> None:
    base, lora = base_and_lora
    assert main(["export", str(base), "--lora", str(lora), "--out", str(tmp_path / "merged")]) == 0
    merged = load_sd3_pipeline(tmp_path / "merged").transformer
    assert not getattr(merged, "peft_config", None)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    with_lora = load_sd3_pipeline(base)
    with_lora.load_lora_weights(lora)
    expected, plain = _velocity(with_lora.transformer), _velocity(load_sd3_pipeline(base).transformer)
    torch.testing.assert_close(_velocity(merged), expected, rtol=1e-5, atol=1e-5)
    assert (expected - plain).abs().max() > 1e-3  # the adapter matters, so the comparison can fail


def test_the_merged_export_loads_with_a_bare_from_pretrained(base_and_lora: tuple[Path, Path], tmp_path: Path) -> None:
    """A user's ``StableDiffusion3Pipeline.from_pretrained(dir)`` with no arguments, though the base has no T5."""
    from diffusers import DiffusionPipeline, StableDiffusion3Pipeline

    base, lora = base_and_lora
    with pytest.raises(ValueError, match="expected"):  # the base, written by a bare save_pretrained, does not
        StableDiffusion3Pipeline.from_pretrained(base)
    assert main(["export", str(base), "--lora", str(lora), "--out", str(tmp_path / "merged")]) == 0
    merged = DiffusionPipeline.from_pretrained(tmp_path / "merged")
    assert isinstance(merged, StableDiffusion3Pipeline)
    torch.testing.assert_close(
        _velocity(merged.transformer), _velocity(load_sd3_pipeline(tmp_path / "merged").transformer), rtol=0, atol=0
    )


def test_export_without_an_adapter_exits_2_naming_the_directory(
    base_and_lora: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, _ = base_and_lora
    assert main(["export", str(base), "--lora", str(tmp_path), "--out", str(tmp_path / "merged")]) == 2
    assert str(tmp_path) in capsys.readouterr().err
    assert not (tmp_path / "merged").exists()
