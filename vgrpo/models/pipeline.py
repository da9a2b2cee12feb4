"""Loading an SD3-family pipeline directory and the three things training needs from it: prompt
conditioning, the velocity model and latent <-> image conversion.

The same code loads a real SD3.5-Medium directory and the embedded default (:mod:`vgrpo.models.embedded`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vgrpo.policy import Conditioning

__all__ = ["PipelineError", "SD3Adapter", "load_sd3_pipeline"]


class PipelineError(ValueError):
    """A pipeline directory is missing or incomplete; the message names the path and the component."""


def _check_pipeline_dir(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise PipelineError(f"{path}: pipeline directory not found")
    index_file = path / "model_index.json"
    if not index_file.is_file():
        raise PipelineError(f"{path}: no model_index.json (not a diffusers pipeline directory)")
    try:
        index: dict[str, Any] = json.loads(index_file.read_text())
    except json.JSONDecodeError as exc:
        raise PipelineError(f"{index_file}: not valid JSON: {exc}") from exc
    if index.get("_class_name") != "StableDiffusion3Pipeline":
        raise PipelineError(
            f"{index_file}: _class_name is {index.get('_class_name')!r}, expected StableDiffusion3Pipeline"
        )
    for name in ("transformer", "vae", "scheduler", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2"):
        spec = index.get(name)
        if not spec or spec[0] is None:
            raise PipelineError(f"{index_file}: component {name!r} is missing or null")
        if not (path / name).is_dir():
            raise PipelineError(f"{path}: component folder {name}/ is missing")
    return index


def load_sd3_pipeline(path: str | Path, *, dtype: torch.dtype = torch.float32, load_t5: bool = True) -> Any:
    """``StableDiffusion3Pipeline.from_pretrained`` from a local directory (never the hub).

    Args:
        path: a diffusers SD3 pipeline directory (SD3.5-M, or the embedded default).
        dtype: weights dtype.
        load_t5: load ``text_encoder_3`` when the directory has one; False skips it (zeros stand in for
            its tokens, as diffusers does for pipelines without T5).

    Raises:
        PipelineError: naming the path and the missing component.
    """
    from diffusers import StableDiffusion3Pipeline

    root = Path(path)
    index = _check_pipeline_dir(root)
    has_t5 = bool(index.get("text_encoder_3")) and index["text_encoder_3"][0] is not None
    extra: dict[str, Any] = {} if (has_t5 and load_t5) else {"text_encoder_3": None, "tokenizer_3": None}
    if has_t5 and load_t5 and not (root / "text_encoder_3").is_dir():
        raise PipelineError(f"{root}: component folder text_encoder_3/ is missing (or pass load_t5=False)")
    pipe = StableDiffusion3Pipeline.from_pretrained(root, local_files_only=True, torch_dtype=dtype, **extra)
    pipe.set_progress_bar_config(disable=True)
    return pipe


class SD3Adapter:
    """What training and evaluation need from a ``StableDiffusion3Pipeline``.

    Prompt conditioning is cached per prompt string (the text encoders are frozen), so a prompt is
    encoded once per run however many iterations see it.
    """

    def __init__(self, pipe: Any, *, max_sequence_length: int | None = None):
        self.pipe = pipe
        self.transformer = pipe.transformer
        self.vae = pipe.vae
        # Without T5 its tokens are zeros; the embedded default drops them (0) to keep sequences short.
        self.max_sequence_length = (
            max_sequence_length if max_sequence_length is not None else (256 if pipe.text_encoder_3 else 0)
        )
        self._cache: dict[str, tuple[Tensor, Tensor]] = {}

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of the transformer's input at the pipeline's default resolution."""
        cfg = self.transformer.config
        return (int(cfg.in_channels), int(cfg.sample_size), int(cfg.sample_size))

    @property
    def resolution(self) -> int:
        return int(self.transformer.config.sample_size) * int(self.pipe.vae_scale_factor)

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        """Conditioning for ``prompts`` (one row per prompt), from the pipeline's own ``encode_prompt``."""
        # One prompt per call: a batched encode rounds differently with its batch-mates, and a prompt's
        # embedding must not depend on which iteration first saw it (a resumed run would drift by 1e-10).
        for p in sorted({p for p in prompts if p not in self._cache}):
            embeds, _, pooled, _ = self.pipe.encode_prompt(
                prompt=[p],
                prompt_2=None,
                prompt_3=None,
                do_classifier_free_guidance=False,
                max_sequence_length=self.max_sequence_length,
            )
            self._cache[p] = (embeds[0].detach(), pooled[0].detach())
        rows = [self._cache[p] for p in prompts]
        return Conditioning(
            prompt_embeds=torch.stack([r[0] for r in rows]),
            pooled_prompt_embeds=torch.stack([r[1] for r in rows]),
        )

    def encode_images(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Images in [-1, 1] ``(N, 3, H, W)`` -> normalised latents (a posterior sample, SD3's training input)."""
        cfg = self.vae.config
        dist = self.vae.encode(images.to(self.vae.dtype)).latent_dist
        z = dist.sample(generator=generator)
        return (z - (cfg.shift_factor or 0.0)) * cfg.scaling_factor

    def decode(self, latents: Tensor) -> Tensor:
        """Normalised latents -> images in [-1, 1] ``(N, 3, H, W)``, float32."""
        cfg = self.vae.config
        z = latents / cfg.scaling_factor + (cfg.shift_factor or 0.0)
        return self.vae.decode(z.to(self.vae.dtype), return_dict=False)[0].float()
