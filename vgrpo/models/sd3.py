"""SD3-family transformer as a velocity model (SD3.5-M, and the embedded default).

diffusers' SD3 transformer predicts the rectified-flow velocity and takes ``timestep = 1000 t``
(the scheduler's ``timesteps = sigmas * 1000``), algorithm.md §1.
"""

from __future__ import annotations

from torch import Tensor, nn

from vgrpo.policy import Conditioning

__all__ = ["SD3Velocity"]


class SD3Velocity(nn.Module):
    """Wraps an ``SD3Transformer2DModel``: ``(latents (N, C, H, W), t (N,), cond) -> v_hat``."""

    def __init__(self, transformer: nn.Module):
        super().__init__()
        self.transformer = transformer

    def forward(self, latents: Tensor, t: Tensor, cond: Conditioning) -> Tensor:
        if cond.pooled_prompt_embeds is None:
            raise ValueError("SD3 needs pooled_prompt_embeds in the conditioning")
        dtype = next(self.transformer.parameters()).dtype
        out = self.transformer(
            hidden_states=latents.to(dtype),
            timestep=(t * 1000).to(dtype),
            encoder_hidden_states=cond.prompt_embeds.to(dtype),
            pooled_projections=cond.pooled_prompt_embeds.to(dtype),
            return_dict=False,
        )[0]
        return out.to(latents.dtype)
