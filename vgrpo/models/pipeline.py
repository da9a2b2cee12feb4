"""Loading a diffusers pipeline directory (SD3 family or FLUX.1) and the three things training needs from it:
prompt conditioning, the velocity model and latent <-> image conversion.

The same code loads a real SD3.5-Medium or FLUX.1 directory and the embedded default
(:mod:`vgrpo.models.embedded`). :class:`PipelineAdapter` holds what every family shares (prompt cache, latent
size, VAE normalisation, timestep shift); :class:`SD3Adapter` and :class:`vgrpo.models.flux.FluxAdapter` add
their text encoding and latent layout.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vgrpo.errors import UserError
from vgrpo.flow import resolution_shift_mu
from vgrpo.policy import Conditioning

__all__ = ["PipelineAdapter", "PipelineError", "SD3Adapter", "build_adapter", "load_pipeline", "load_sd3_pipeline"]

_TWO_TEXT_ENCODERS = ("transformer", "vae", "scheduler", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")
PIPELINE_COMPONENTS: dict[str, tuple[str, ...]] = {
    "StableDiffusion3Pipeline": _TWO_TEXT_ENCODERS,
    "FluxPipeline": _TWO_TEXT_ENCODERS,
}
"""Pipeline classes we load, and the components each must have (SD3's T5 is optional: :func:`load_sd3_pipeline`)."""


class PipelineError(UserError, ValueError):
    """A pipeline directory is missing or incomplete; the message names the path and the component."""


def _check_pipeline_dir(path: Path, expected: Sequence[str] = tuple(PIPELINE_COMPONENTS)) -> dict[str, Any]:
    """``model_index.json`` of ``path`` after checking its class is one of ``expected`` and its components exist."""
    if not path.is_dir():
        raise PipelineError(f"{path}: pipeline directory not found")
    index_file = path / "model_index.json"
    if not index_file.is_file():
        raise PipelineError(f"{path}: no model_index.json (not a diffusers pipeline directory)")
    try:
        index: dict[str, Any] = json.loads(index_file.read_text())
    except json.JSONDecodeError as exc:
        raise PipelineError(f"{index_file}: not valid JSON: {exc}") from exc
    cls = index.get("_class_name")
    if cls not in expected:
        raise PipelineError(f"{index_file}: _class_name is {cls!r}, expected {' or '.join(expected)}")
    for name in PIPELINE_COMPONENTS[str(cls)]:
        spec = index.get(name)
        if not spec or spec[0] is None:
            raise PipelineError(f"{index_file}: component {name!r} is missing or null")
        if not (path / name).is_dir():
            raise PipelineError(f"{path}: component folder {name}/ is missing")
    return index


def load_pipeline(path: str | Path, *, dtype: torch.dtype = torch.float32) -> Any:
    """A ``StableDiffusion3Pipeline`` or ``FluxPipeline`` from a local directory (never the hub), by its
    ``model_index.json`` ``_class_name``.

    Raises:
        PipelineError: naming the path and the missing component, or the unsupported class.
    """
    root = Path(path)
    index = _check_pipeline_dir(root)
    if index["_class_name"] == "StableDiffusion3Pipeline":
        return load_sd3_pipeline(root, dtype=dtype)
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(root, local_files_only=True, use_safetensors=True, dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe


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
    index = _check_pipeline_dir(root, ("StableDiffusion3Pipeline",))
    has_t5 = bool(index.get("text_encoder_3")) and index["text_encoder_3"][0] is not None
    extra: dict[str, Any] = {} if (has_t5 and load_t5) else {"text_encoder_3": None, "tokenizer_3": None}
    if has_t5 and load_t5 and not (root / "text_encoder_3").is_dir():
        raise PipelineError(f"{root}: component folder text_encoder_3/ is missing (or pass load_t5=False)")
    pipe = StableDiffusion3Pipeline.from_pretrained(
        root, local_files_only=True, use_safetensors=True, dtype=dtype, **extra
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def build_adapter(pipe: Any, *, resolution: int | None = None) -> tuple[PipelineAdapter, nn.Module]:
    """The adapter and the velocity model (the policy, wrapping ``pipe.transformer`` itself, so LoRA added to
    the transformer before or after is trained) for a pipeline from :func:`load_pipeline`.

    Args:
        resolution: image side in pixels; None = the pipeline's default.
    """
    from diffusers import FluxPipeline, StableDiffusion3Pipeline

    transformer: nn.Module = pipe.transformer
    if isinstance(pipe, FluxPipeline):
        from vgrpo.models.flux import FluxAdapter, FluxVelocity

        return FluxAdapter(pipe, resolution=resolution), FluxVelocity(transformer)
    if isinstance(pipe, StableDiffusion3Pipeline):
        from vgrpo.models.sd3 import SD3Velocity

        return SD3Adapter(pipe, resolution=resolution), SD3Velocity(transformer)
    raise TypeError(f"no adapter for {type(pipe).__name__}; expected {' or '.join(PIPELINE_COMPONENTS)}")


class PipelineAdapter(ABC):
    """What training and evaluation need from a pipeline: prompt conditioning, the latent shape at the chosen
    resolution, latent <-> image conversion and the sampling schedule's shift.

    Prompt conditioning is cached per prompt string (the text encoders are frozen), so a prompt is encoded
    once per run however many iterations see it.

    Args:
        pipe: the diffusers pipeline.
        resolution: image side in pixels, a multiple of ``vae_scale_factor * patch_size``; None = the
            pipeline's default.
    """

    def __init__(self, pipe: Any, *, resolution: int | None = None):
        self.pipe = pipe
        self.transformer = pipe.transformer
        self.vae = pipe.vae
        self._cache: dict[str, tuple[Tensor, Tensor]] = {}
        self.resolution = self.default_resolution if resolution is None else int(resolution)
        step = int(pipe.vae_scale_factor) * self.patch_size
        if self.resolution <= 0 or self.resolution % step:
            raise ValueError(
                f"resolution {self.resolution} px is not a positive multiple of {step} (the VAE's "
                f"{pipe.vae_scale_factor}x downsampling times the transformer's {self.patch_size}x{self.patch_size} "
                "patches)"
            )

    @property
    @abstractmethod
    def latent_channels(self) -> int:
        """``C`` of the spatial latents the policy reads."""

    @property
    @abstractmethod
    def default_resolution(self) -> int:
        """The pipeline's own image side in pixels."""

    @abstractmethod
    def _encode_prompt(self, prompt: str) -> tuple[Tensor, Tensor]:
        """One prompt's ``(token embeddings (L, D), pooled embedding (P,))`` from the pipeline's ``encode_prompt``."""

    @property
    def patch_size(self) -> int:
        """Side of the transformer's latent patches (2 for SD3 and FLUX)."""
        return 2

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of the policy's input at :attr:`resolution`."""
        side = self.resolution // int(self.pipe.vae_scale_factor)
        return (self.latent_channels, side, side)

    @property
    def image_seq_len(self) -> int:
        """Image tokens the transformer sees at :attr:`resolution` (what FLUX's dynamic shift depends on)."""
        _, h, w = self.latent_shape
        return (h // self.patch_size) * (w // self.patch_size)

    def dynamic_shift(self) -> float:
        """FLUX's resolution-dependent shift as the equivalent static shift ``s = e^mu``, algorithm.md §1.

        ``mu`` is diffusers' ``calculate_shift`` of :attr:`image_seq_len` with the scheduler's
        ``base_shift``/``max_shift``/``base_image_seq_len``/``max_image_seq_len``; its exponential time shift
        ``e^mu / (e^mu + 1/t - 1)`` equals the static ``s t / (1 + (s - 1) t)`` at ``s = e^mu``, so one sigma
        grid builder (:func:`vgrpo.flow.timestep_grid`) serves both.
        """
        cfg = self.pipe.scheduler.config
        if cfg.get("time_shift_type", "exponential") != "exponential":
            raise ValueError(f"time_shift_type {cfg.get('time_shift_type')!r} is not supported (only exponential)")
        mu = resolution_shift_mu(
            self.image_seq_len,
            base_seq_len=cfg.get("base_image_seq_len", 256),
            max_seq_len=cfg.get("max_image_seq_len", 4096),
            base_shift=cfg.get("base_shift", 0.5),
            max_shift=cfg.get("max_shift", 1.15),
        )
        return math.exp(mu)

    def sigma_shift(self, shift: float | None, *, dynamic: bool) -> float | None:
        """The static shift of the sampling grid: :meth:`dynamic_shift` when ``dynamic``, else ``shift``."""
        if dynamic and shift is not None:
            raise ValueError(f"a dynamic shift replaces the static one; got both (shift={shift})")
        return self.dynamic_shift() if dynamic else shift

    @property
    def scheduler_shift(self) -> float | None:
        """The shift the pipeline's own scheduler samples with (dynamic when ``use_dynamic_shifting``)."""
        cfg = self.pipe.scheduler.config
        dynamic = bool(cfg.get("use_dynamic_shifting", False))
        return self.sigma_shift(None if dynamic else float(cfg.shift), dynamic=dynamic)

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        """Conditioning for ``prompts`` (one row per prompt), from the pipeline's own ``encode_prompt``."""
        # One prompt per call: a batched encode rounds differently with its batch-mates, and a prompt's
        # embedding must not depend on which iteration first saw it (a resumed run would drift by 1e-10).
        for p in sorted({p for p in prompts if p not in self._cache}):
            embeds, pooled = self._encode_prompt(p)
            self._cache[p] = (embeds.detach(), pooled.detach())
        rows = [self._cache[p] for p in prompts]
        return Conditioning(
            prompt_embeds=torch.stack([r[0] for r in rows]),
            pooled_prompt_embeds=torch.stack([r[1] for r in rows]),
        )

    def encode_images(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Images in [-1, 1] ``(N, 3, H, W)`` -> normalised latents ``(z - shift_factor) * scaling_factor``
        (a posterior sample, the training input of SD3 and FLUX)."""
        cfg = self.vae.config
        dist = self.vae.encode(images.to(self.vae.dtype)).latent_dist
        z = dist.sample(generator=generator)
        return (z - (cfg.shift_factor or 0.0)) * cfg.scaling_factor

    def decode(self, latents: Tensor) -> Tensor:
        """Normalised latents -> images in [-1, 1] ``(N, 3, H, W)``, float32."""
        cfg = self.vae.config
        z = latents / cfg.scaling_factor + (cfg.shift_factor or 0.0)
        return self.vae.decode(z.to(self.vae.dtype), return_dict=False)[0].float()


class SD3Adapter(PipelineAdapter):
    """A ``StableDiffusion3Pipeline``'s :class:`PipelineAdapter`: CLIP-L/G (+ T5) token embeddings and the two
    pooled CLIP vectors per prompt.

    Args:
        resolution: image side in pixels; None = ``transformer.config.sample_size * vae_scale_factor``.
        max_sequence_length: T5 tokens; None = 256 with T5, 0 without (its tokens would be zeros).
    """

    def __init__(self, pipe: Any, *, resolution: int | None = None, max_sequence_length: int | None = None):
        super().__init__(pipe, resolution=resolution)
        # Without T5 its tokens are zeros; the embedded default drops them (0) to keep sequences short.
        self.max_sequence_length = (
            max_sequence_length if max_sequence_length is not None else (256 if pipe.text_encoder_3 else 0)
        )

    @property
    def latent_channels(self) -> int:
        return int(self.transformer.config.in_channels)

    @property
    def patch_size(self) -> int:
        return int(self.transformer.config.patch_size)

    @property
    def default_resolution(self) -> int:
        return int(self.transformer.config.sample_size) * int(self.pipe.vae_scale_factor)

    def _encode_prompt(self, prompt: str) -> tuple[Tensor, Tensor]:
        embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=[prompt],
            prompt_2=None,
            prompt_3=None,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
        )
        return embeds[0], pooled[0]
