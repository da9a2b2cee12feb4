"""The committed embedded base (``models/embedded-base``) and a LoRA on its transformer, as the artifact tests
(tests/models/test_artifacts.py, tests/tasks/test_model_registry.py) export and load it."""

from __future__ import annotations

from pathlib import Path

import torch

BASE = Path(__file__).resolve().parents[2] / "models" / "embedded-base"


def saved_lora_transformer(out: Path) -> torch.nn.Module:
    """The base's transformer with a rank-4 LoRA on the default targets, its B weights moved off their zero init
    (seeded, so the adapter changes the output), saved with :func:`vgrpo.checkpoints.state.save_lora` to ``out``."""
    from vgrpo.checkpoints.state import save_lora
    from vgrpo.models import add_lora
    from vgrpo.models.config import LoraConfig
    from vgrpo.models.pipeline import load_sd3_pipeline

    transformer = load_sd3_pipeline(BASE).transformer
    add_lora(transformer, rank=4, alpha=8, target_modules=LoraConfig().target_modules)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    save_lora(transformer, out)
    return transformer
