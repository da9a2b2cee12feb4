"""The arguments that make ``StableDiffusion3Pipeline.__call__`` sample what the project's sampler samples.

diffusers' defaults differ from the project's sampling in four ways (docs/real-models.md, "The same images in
diffusers"): classifier-free guidance at 7.0 (the project samples without CFG), 256 T5 tokens (the embedded
default has none, :mod:`vgrpo.models.saving`), the sigma grid (diffusers' ``linspace(1, 1/1000, T)``, the
project's ``linspace(1, 0, T + 1)``: :func:`vgrpo.flow.timestep_grid`) and the noise. :func:`diffusers_call_kwargs`
gives all four as keyword arguments of the pipeline's own call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from diffusers import StableDiffusion3Pipeline

from vgrpo.flow import timestep_grid
from vgrpo.models.saving import ABSENT_T5_KEY, is_sd3
from vgrpo.seeding import sample_noise

__all__ = ["diffusers_call_kwargs", "diffusers_sigmas"]


def diffusers_sigmas(scheduler_config: Any, num_steps: int, shift: float | None = None) -> list[float]:
    """The ``sigmas=`` to pass a pipeline with this (static-shift) scheduler so it steps on the project's grid
    ``timestep_grid(num_steps, shift=shift)``; ``shift`` None = the scheduler's own shift (the project's default
    for SD3: ``PipelineAdapter.scheduler_shift``).

    The scheduler shifts the sigmas it is given by its own ``shift``, and appends the final 0, so this is the
    pre-image of the grid without its last value under that shift: ``u = s / (c - (c - 1) s)`` for scheduler shift
    ``c``.
    """
    if bool(scheduler_config.get("use_dynamic_shifting", False)):
        raise ValueError(
            "the scheduler shifts dynamically (FLUX.1): its pipeline computes the shift itself; "
            "diffusers_call_kwargs supports static-shift (SD3-family) schedulers only"
        )
    own = float(scheduler_config["shift"])
    grid = timestep_grid(num_steps, shift=own if shift is None else shift).double()[:-1]
    return [float(u) for u in grid / (own - (own - 1) * grid)]


@torch.no_grad()
def diffusers_call_kwargs(
    pipe: Any,
    prompts: Sequence[str],
    *,
    num_steps: int,
    shift: float | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``pipe(**kwargs)`` (a ``StableDiffusion3Pipeline``, loaded by a plain
    ``from_pretrained``) that sample ``prompts`` as the project's Euler sampler does.

    * ``guidance_scale=1.0``: no classifier-free guidance, as the project's rollouts and evaluations;
    * ``prompt_embeds`` / ``pooled_prompt_embeds``: each prompt encoded alone by the two CLIP encoders, and by T5
      with 256 tokens when the pipeline has a real one (the project's rule, ``SD3Adapter``); a pipeline without
      T5 or with the stand-in of :mod:`vgrpo.models.saving` gets no T5 tokens;
    * ``num_inference_steps`` and ``sigmas``: :func:`diffusers_sigmas`;
    * ``latents`` (with ``seed``): the noise the project's evaluation draws for sample ``i`` of a run with that
      seed (:func:`vgrpo.seeding.sample_noise`), at the pipeline's default resolution.
    """
    if not is_sd3(pipe):
        raise TypeError(f"diffusers_call_kwargs takes a StableDiffusion3Pipeline, got {type(pipe).__name__}")
    has_t5 = pipe.text_encoder_3 is not None and not hasattr(pipe.text_encoder_3.config, ABSENT_T5_KEY)
    encoder: Any = pipe if has_t5 else StableDiffusion3Pipeline(**{**pipe.components, "text_encoder_3": None})
    rows = [
        encoder.encode_prompt(
            prompt=[p], prompt_2=None, prompt_3=None, do_classifier_free_guidance=False,
            max_sequence_length=256 if has_t5 else 0,
        )
        for p in prompts
    ]  # fmt: skip
    kwargs: dict[str, Any] = {
        "prompt_embeds": torch.cat([r[0] for r in rows]),
        "pooled_prompt_embeds": torch.cat([r[2] for r in rows]),
        "guidance_scale": 1.0,
        "num_inference_steps": num_steps,
        "sigmas": diffusers_sigmas(pipe.scheduler.config, num_steps, shift),
    }
    if seed is not None:
        side = int(pipe.transformer.config.sample_size)
        shape = (int(pipe.transformer.config.in_channels), side, side)
        kwargs["latents"] = sample_noise(seed, range(len(prompts)), shape)
    return kwargs
