"""What the algorithms need from a model: a velocity field, its conditioning and its trainable weights.

A *policy* is any ``torch.nn.Module`` whose ``forward(latents, t, cond)`` returns the velocity
``v_hat`` with the shape of ``latents`` and whose trainable parameters (``requires_grad``) are the
ones RL updates: LoRA adapters, or every weight for full fine-tuning. Adapters for real diffusers
transformers live in :mod:`vgrpo.models`.

Other copies of the weights an algorithm needs (Flow-GRPO's frozen reference, DiffusionNFT's
"old" EMA policy) are :class:`ParameterSnapshot` s of the trainable parameters swapped in place,
so that LoRA and full fine-tuning share one mechanism and a LoRA snapshot costs only the adapter. Under FSDP
(:mod:`vgrpo.parallel.fsdp`) the parameters are DTensors and a snapshot holds each rank's shards only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from vgrpo.parallel.distributed import is_sharded

__all__ = ["Conditioning", "ParameterSnapshot", "VelocityModel", "trainable_parameters"]


@dataclass(frozen=True)
class Conditioning:
    """A batch's conditioning: its text, and for editing families the condition image; every tensor batch-first.

    Attributes:
        prompt_embeds: ``(B, L, D)`` token embeddings (SD3: CLIP-L/G + T5 joint sequence).
        pooled_prompt_embeds: ``(B, P)`` pooled embeddings, or ``None`` for models without them.
        prompt_mask: ``(B, L)`` bool, True on each prompt's own tokens, for models whose prompts have their own
            lengths (Z-Image: the rows are padded to the batch's longest); ``None`` = every token counts.
        image_latents: ``(B, C, h, w)`` normalised VAE latents of each row's condition (source) image, for editing
            families (FLUX.1-Kontext, :mod:`vgrpo.models.flux_kontext`: every forward of the velocity model sees
            them, so the rollout, the surrogate's and the ELBO's evaluations all do); ``None`` = text only.
    """

    prompt_embeds: Tensor
    pooled_prompt_embeds: Tensor | None = None
    prompt_mask: Tensor | None = None
    image_latents: Tensor | None = None

    def __post_init__(self) -> None:
        pooled, mask, image = self.pooled_prompt_embeds, self.prompt_mask, self.image_latents
        if pooled is not None and pooled.shape[0] != self.prompt_embeds.shape[0]:
            raise ValueError(
                f"pooled_prompt_embeds has batch {pooled.shape[0]}, prompt_embeds {self.prompt_embeds.shape[0]}"
            )
        if image is not None and (image.ndim != 4 or image.shape[0] != self.prompt_embeds.shape[0]):
            raise ValueError(
                f"image_latents must be (B, C, h, w) with B = {self.prompt_embeds.shape[0]}, got {tuple(image.shape)}"
            )
        if mask is not None and (mask.dtype != torch.bool or mask.shape != self.prompt_embeds.shape[:2]):
            raise ValueError(
                f"prompt_mask must be bool of shape {tuple(self.prompt_embeds.shape[:2])}, "
                f"got {mask.dtype} {tuple(mask.shape)}"
            )

    def __len__(self) -> int:
        return int(self.prompt_embeds.shape[0])

    def _map(self, fn: Callable[[Tensor], Tensor], mask_fn: Callable[[Tensor], Tensor] | None = None) -> Conditioning:
        pooled, mask, image = self.pooled_prompt_embeds, self.prompt_mask, self.image_latents
        return Conditioning(
            prompt_embeds=fn(self.prompt_embeds),
            pooled_prompt_embeds=None if pooled is None else fn(pooled),
            prompt_mask=None if mask is None else (mask_fn or fn)(mask),
            image_latents=None if image is None else fn(image),
        )

    def index(self, idx: Tensor) -> Conditioning:
        """Rows ``idx`` (a ``(n,)`` long tensor) of every tensor."""
        return self._map(lambda x: x.index_select(0, idx.to(x.device)))

    def repeat_interleave(self, repeats: int) -> Conditioning:
        """Each prompt repeated ``repeats`` times in place: prompts ``(B,)`` -> samples ``(B * G,)``."""
        return self._map(lambda x: x.repeat_interleave(repeats, dim=0))

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> Conditioning:
        """On ``device``, the embeddings in ``dtype`` (the mask stays bool)."""
        return self._map(lambda x: x.to(device=device, dtype=dtype), lambda m: m.to(device=device))


@runtime_checkable
class VelocityModel(Protocol):
    """``(latents (N, *S), t (N,) in [0, 1], cond with N rows) -> v_hat (N, *S)``."""

    def __call__(self, latents: Tensor, t: Tensor, cond: Conditioning) -> Tensor: ...


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters RL updates, in a stable order."""
    return [p for p in module.parameters() if p.requires_grad]


class ParameterSnapshot:
    """A detached copy of some parameters that can be swapped into the live model.

    Used for the frozen reference policy (Flow-GRPO's KL) and the EMA "old" policy (DiffusionNFT).
    Swapping exchanges storage, so it is O(1) and leaves the optimizer's parameter objects intact.

    A sharded (FSDP) parameter's snapshot is a DTensor of the same sharding: this rank's shard. FSDP all-gathers a
    parameter from the storage its shard had when it was sharded, which a ``.data`` swap would leave behind, so
    sharded values are exchanged in place instead, one shard's worth of scratch memory at a time. That is right
    whenever the parameters are in their shards, which :func:`vgrpo.parallel.fsdp.shard_transformer` keeps true between
    forward passes (it reshards after every forward, the root included).
    """

    def __init__(self, params: Sequence[nn.Parameter]):
        self.params = list(params)
        self.values = [p.detach().clone() for p in self.params]

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Run the block with the snapshot's values in the live parameters, then restore them."""
        self._swap()
        try:
            yield
        finally:
            self._swap()

    @torch.no_grad()
    def _swap(self) -> None:
        for i, p in enumerate(self.params):
            if is_sharded(p):
                live = p.detach().clone()
                p.copy_(self.values[i])
                self.values[i].copy_(live)
            else:
                p.data, self.values[i] = self.values[i], p.data

    @torch.no_grad()
    def ema_update(self, decay: float) -> None:
        """``snapshot <- decay * snapshot + (1 - decay) * live`` (decay 0 copies the live weights)."""
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"EMA decay must lie in [0, 1], got {decay}")
        for p, v in zip(self.params, self.values, strict=True):
            v.mul_(decay).add_(p.detach(), alpha=1 - decay)
