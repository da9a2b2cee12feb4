"""The pipeline-adapter interface: what training and evaluation need from a diffusers text-to-image pipeline.

:class:`PipelineAdapter` holds what every family shares (prompt cache, latent size, VAE normalisation,
timestep shift); each family's subclass (:class:`vgrpo.models.sd3.SD3Adapter`, :class:`vgrpo.models.flux.FluxAdapter`,
...) is the family: its class attributes name its pipeline, transformer, components, velocity wrapper and LoRA
targets, its :meth:`PipelineAdapter.geometry` reads the image sides from a folder's configs, and its methods add the
text encoding and latent layout. :mod:`vgrpo.models.registry` finds the class by name, and
:func:`vgrpo.models.pipeline.build_adapter` the one of a loaded pipeline.
"""

from __future__ import annotations

import copy
import gc
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from vgrpo.errors import ConfigError
from vgrpo.flow import resolution_shift_mu
from vgrpo.images import tensor_to_images
from vgrpo.models.config import PrecisionConfig
from vgrpo.models.geometry import FamilyGeometry
from vgrpo.models.prompt_cache import PromptEmbeddingCache
from vgrpo.policy import Conditioning

__all__ = [
    "DEFAULT_PROMPT_CACHE_BYTES",
    "ONE_TEXT_ENCODER",
    "TWO_TEXT_ENCODERS",
    "PipelineAdapter",
    "padded_conditioning",
]

DEFAULT_PROMPT_CACHE_BYTES = int(PrecisionConfig.model_fields["prompt_cache_mb"].default * 2**20)
"""The prompt cache's budget when none is given: ``precision.prompt_cache_mb``'s default."""

TWO_TEXT_ENCODERS = ("transformer", "vae", "scheduler", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")
ONE_TEXT_ENCODER = ("transformer", "vae", "scheduler", "text_encoder", "tokenizer")
"""The components of a pipeline with two text encoders (SD3, FLUX.1) and with one."""


class PipelineAdapter(ABC):
    """What training and evaluation need from a pipeline: prompt conditioning, the latent shape at the chosen
    resolution, latent <-> image conversion and the sampling schedule's shift.

    Prompt conditioning is cached per prompt string in CPU memory (the text encoders are frozen;
    :class:`vgrpo.models.prompt_cache.PromptEmbeddingCache`) and each batch's rows are moved to the transformer's
    device. With ``text_encoders="drop_after_encoding"``, :meth:`encode_ahead` encodes the stage's whole prompt set
    and deletes the text encoders (``precision.text_encoders``, :class:`vgrpo.models.config.PrecisionConfig`).

    Args:
        pipe: the diffusers pipeline.
        resolution: image side in pixels, a multiple of ``vae_scale_factor * patch_size``; None = the
            pipeline's default.
        prompt_cache_bytes: the cache's CPU memory budget.
        text_encoders: ``device`` / ``cpu`` (where :func:`vgrpo.models.pipeline.place_pipeline` put them: nothing
            changes here) or ``drop_after_encoding``.

    A family's subclass sets the class attributes below (:data:`vgrpo.models.registry.REQUIRED` names those the
    registry checks) and :meth:`geometry`.
    """

    name: ClassVar[str]
    """The family's name in :mod:`vgrpo.models.registry`."""
    pipeline_class: ClassVar[str]
    """The diffusers pipeline class (``model_index.json``'s ``_class_name``)."""
    transformer_class: ClassVar[str]
    """The diffusers transformer class the pipeline holds."""
    components: ClassVar[tuple[str, ...]]
    """The components a folder of the family must have (optional ones, like SD3's T5, left out)."""
    lora_targets: ClassVar[tuple[str, ...]]
    """The module names LoRA adapts in the family's attention: ``lora.target_modules`` at its default."""
    velocity: ClassVar[type[nn.Module]]
    """The velocity wrapper: ``velocity(transformer) -> VelocityModel``."""
    video: ClassVar[bool] = False
    """The family samples videos (its adapter takes ``num_frames``; its latents carry a frame axis)."""

    @staticmethod
    def geometry(transformer: Mapping[str, Any], vae: Mapping[str, Any]) -> FamilyGeometry:
        """The image sides a folder of the family can sample, from its ``transformer/config.json`` and
        ``vae/config.json``; KeyError/TypeError/ValueError/IndexError when a config lacks what it needs."""
        raise NotImplementedError

    @classmethod
    def diffusers_pipeline(cls) -> Any:
        """The diffusers pipeline class, imported now."""
        import diffusers

        return getattr(diffusers, cls.pipeline_class)

    @classmethod
    def diffusers_transformer(cls) -> Any:
        """The diffusers transformer class, imported now."""
        import diffusers

        return getattr(diffusers, cls.transformer_class)

    def __init__(
        self,
        pipe: Any,
        *,
        resolution: int | None = None,
        prompt_cache_bytes: int = DEFAULT_PROMPT_CACHE_BYTES,
        text_encoders: str = "device",
    ):
        self.pipe = pipe
        self.transformer = pipe.transformer
        self.vae = pipe.vae
        self.prompt_cache = PromptEmbeddingCache(prompt_cache_bytes)
        self.text_encoders = text_encoders
        self.text_encoders_dropped = False
        self.resolution = self._checked(self.default_resolution if resolution is None else int(resolution))

    def _checked(self, resolution: int) -> int:
        step = self.vae_scale_factor * self.patch_size
        if resolution <= 0 or resolution % step:
            raise ValueError(
                f"resolution {resolution} px is not a positive multiple of {step} (the VAE's "
                f"{self.vae_scale_factor}x downsampling times the transformer's "
                f"{self.patch_size}x{self.patch_size} patches)"
            )
        return resolution

    def resized(self, resolution: int) -> PipelineAdapter:
        """This adapter at another image side (checked as the constructor checks it), sharing its pipeline, text
        encoders and prompt cache."""
        resized = copy.copy(self)  # shallow on purpose: one pipeline, one prompt cache
        resized.resolution = self._checked(int(resolution))
        return resized

    @property
    @abstractmethod
    def latent_channels(self) -> int:
        """``C`` of the spatial latents the policy reads."""

    @property
    @abstractmethod
    def default_resolution(self) -> int:
        """The pipeline's own image side in pixels."""

    @abstractmethod
    def _encode_prompt(self, prompt: str) -> tuple[Tensor, ...]:
        """One prompt's ``(token embeddings (L, D), pooled embedding (P,))`` from the pipeline's ``encode_prompt``
        (families without a pooled vector: the token embeddings alone, batched by their :meth:`_batch`)."""

    @property
    def patch_size(self) -> int:
        """Side of the transformer's latent patches (2 for SD3 and FLUX)."""
        return 2

    @property
    def vae_scale_factor(self) -> int:
        """The VAE's spatial downsampling (the pipeline's ``vae_scale_factor``; a video family names it otherwise)."""
        return int(self.pipe.vae_scale_factor)

    @property
    def latent_shape(self) -> tuple[int, ...]:
        """``(C, H, W)`` of the policy's input at :attr:`resolution` (a video family's: ``(C, F, H, W)``)."""
        side = self.resolution // self.vae_scale_factor
        return (self.latent_channels, side, side)

    @property
    def image_seq_len(self) -> int:
        """Image tokens the transformer sees at :attr:`resolution` (what FLUX's dynamic shift depends on)."""
        h, w = self.latent_shape[-2:]
        return (h // self.patch_size) * (w // self.patch_size)

    def dynamic_shift(self, num_steps: int | None = None) -> float:
        """FLUX.1's resolution-dependent shift (diffusers ``FluxPipeline``) as the equivalent static shift ``s = e^mu``.

        ``num_steps`` (the grid's steps) is not read by FLUX.1's rule; a family whose shift depends on it too
        (FLUX.2, :class:`vgrpo.models.flux2.Flux2Adapter`) overrides this and needs it.

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

    def sigma_shift(self, shift: float | None, *, dynamic: bool, num_steps: int | None = None) -> float | None:
        """The static shift of a ``num_steps``-step sampling grid: :meth:`dynamic_shift` when ``dynamic``, else
        ``shift``."""
        if dynamic and shift is not None:
            raise ValueError(f"a dynamic shift replaces the static one; got both (shift={shift})")
        return self.dynamic_shift(num_steps) if dynamic else shift

    def pipeline_shift(self, num_steps: int | None = None) -> float | None:
        """The shift the pipeline's own scheduler samples ``num_steps`` steps with (dynamic when
        ``use_dynamic_shifting``)."""
        cfg = self.pipe.scheduler.config
        dynamic = bool(cfg.get("use_dynamic_shifting", False))
        return self.sigma_shift(None if dynamic else float(cfg.shift), dynamic=dynamic, num_steps=num_steps)

    @property
    def scheduler_shift(self) -> float | None:
        """:meth:`pipeline_shift` of a family whose shift does not depend on the number of steps."""
        return self.pipeline_shift()

    @property
    def device(self) -> torch.device:
        """The transformer's device, where :meth:`encode_prompts` puts the conditioning."""
        return next(self.transformer.parameters()).device

    @property
    def text_encoder_names(self) -> list[str]:
        """The pipeline's text-encoder components that are loaded (``text_encoder``, ``text_encoder_2``, ...)."""
        return [n for n, m in self.pipe.components.items() if n.startswith("text_encoder") and m is not None]

    @property
    def text_encoder_device(self) -> torch.device:
        """Where the text encoders run (the training device, or the CPU with ``text_encoders: cpu``)."""
        return next(getattr(self.pipe, self.text_encoder_names[0]).parameters()).device

    def _encode_cached(self, prompt: str) -> tuple[Tensor, ...]:
        """One prompt's embeddings from the cache, encoding (and caching) them on a miss."""
        hit = self.prompt_cache.get(prompt)
        if hit is not None:
            return hit
        if self.text_encoders_dropped:
            raise RuntimeError(
                f"prompt {prompt!r} was not among the prompts encoded at setup, and the text encoders were "
                "deleted after them (precision.text_encoders: drop_after_encoding); use text_encoders: cpu to "
                "encode prompts met later"
            )
        return self.prompt_cache.put(prompt, self._encode_prompt(prompt))

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Conditioning:
        """Conditioning for ``prompts`` (one row per prompt) on :attr:`device`, from the pipeline's own
        ``encode_prompt``."""
        # One prompt per call: a batched encode rounds differently with its batch-mates, and a prompt's
        # embedding must not depend on which iteration first saw it (a resumed run would drift by 1e-10).
        # Rows are held here until the batch is built: the cache may evict a prompt of this very batch.
        rows = {p: self._encode_cached(p) for p in sorted(set(prompts))}
        return self._batch([rows[p] for p in prompts]).to(self.device)

    def encode_rows(self, rows: Sequence[Mapping[str, Any]]) -> Conditioning:
        """Conditioning for prompt rows (one per sample): :meth:`encode_prompts` of their ``prompt`` s; an editing
        family (:class:`vgrpo.models.flux_kontext.FluxKontextAdapter`) adds the condition images the rows name."""
        return self.encode_prompts([str(r["prompt"]) for r in rows])

    def _batch(self, rows: Sequence[tuple[Tensor, ...]]) -> Conditioning:
        """One batch's conditioning from its prompts' cached ``_encode_prompt`` rows: token embeddings and pooled
        vectors stacked (a family whose prompts have their own lengths pads them and sets the mask)."""
        return Conditioning(
            prompt_embeds=torch.stack([r[0] for r in rows]), pooled_prompt_embeds=torch.stack([r[1] for r in rows])
        )

    @torch.no_grad()
    def encode_ahead(self, prompts: Sequence[str]) -> None:
        """With ``text_encoders="drop_after_encoding"``: encode ``prompts`` (and ``""``, the unconditional prompt
        of guided sampling) into the cache, then delete the text encoders; otherwise nothing (prompts are
        encoded when first met).

        Raises:
            ConfigError: the cache's budget cannot hold them all.
        """
        if self.text_encoders != "drop_after_encoding" or self.text_encoders_dropped:
            return
        unique = sorted({*prompts, ""})
        for p in unique:
            self._encode_cached(p)
        kept = sum(p in self.prompt_cache for p in unique)
        if kept < len(unique):
            per_prompt = self.prompt_cache.nbytes / max(kept, 1) / 2**20
            raise ConfigError(
                f"precision.prompt_cache_mb={self.prompt_cache.max_bytes / 2**20:g} holds {kept} of the stage's "
                f"{len(unique)} prompts (about {per_prompt:.2f} MB each); text_encoders: drop_after_encoding needs "
                f"them all: raise it to at least {per_prompt * len(unique) * 1.01:.0f}, or use text_encoders: cpu"
            )
        self.drop_text_encoders()

    def drop_text_encoders(self) -> None:
        """Delete the text encoders (their device memory is freed); only cached prompts can be encoded after."""
        for name in self.text_encoder_names:
            setattr(self.pipe, name, None)
        self.text_encoders_dropped = True
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

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

    def decode_samples(self, latents: Tensor) -> np.ndarray:
        """Normalised latents -> what the rewards score and the grids draw: uint8 images ``(N, H, W, 3)`` (a video
        family's: uint8 frames ``(N, T, H, W, 3)``, :meth:`vgrpo.models.wan.WanAdapter.decode_samples`)."""
        return tensor_to_images(self.decode(latents))


def padded_conditioning(embeds: Sequence[Tensor]) -> Conditioning:
    """Prompts' token embeddings ``(L_i, D)`` of their own lengths as one batch: zero-padded to the longest, with
    :attr:`Conditioning.prompt_mask` True on each prompt's own tokens (Z-Image, Qwen-Image)."""
    longest = max(e.shape[0] for e in embeds)
    padded = torch.zeros(len(embeds), longest, embeds[0].shape[1], dtype=embeds[0].dtype)
    mask = torch.zeros(len(embeds), longest, dtype=torch.bool)
    for i, e in enumerate(embeds):
        padded[i, : e.shape[0]] = e
        mask[i, : e.shape[0]] = True
    return Conditioning(prompt_embeds=padded, prompt_mask=mask)
