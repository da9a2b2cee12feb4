"""Evaluation: sample a fixed prompt set with fixed seeds, score every image with every reward, write a table.

What the pipeline's evaluate task runs after each stage, and what the paper's tables report: GenEval per tag
(strict, the overall score the mean of the per-tag accuracies, Ghosh et al. 2023), OCR accuracy over OCR
prompts, and the mean of each preference reward over the prompts it applies to. Sampling is the RL rollout's
Euler ODE, optionally with classifier-free guidance (the paper reports SD3.5-M with and without CFG) and with
MixGRPO's hybrid sampling (the trained model for the first ``p_mix * T`` steps, the base for the rest; the
paper's FLUX evaluation uses ``p_mix = 0.8``).

Every sample's initial noise comes from its own generator seeded by ``(seed, sample index)``, so an image does
not depend on the micro-batch size or on which other prompts are evaluated with it.

A stage evaluates at its own resolution and shift when it sets them (``evaluation.resolution``,
``evaluation.shift``): the paper's FLUX protocol trains at 720 px and evaluates at 1024 px (V-GRPO App. A.1), and
FLUX's shift depends on the image's token count, so the evaluation's is recomputed at its resolution.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from vgrpo.evaluation.config import EvaluationConfig
from vgrpo.evaluation.tables import summarise
from vgrpo.flow import timestep_grid
from vgrpo.policy import Conditioning, VelocityModel
from vgrpo.rewards.base import Metadata
from vgrpo.rewards.multi import MultiReward, MultiRewardOutput
from vgrpo.samplers import ClassifierFreeGuidance, euler_ode_sample, hybrid_euler_sample
from vgrpo.seeding import sample_noise

__all__ = [
    "Evaluator",
    "Sampling",
    "evaluate",
    "generate",
    "resized_adapter",
    "sampling_shift",
]


@dataclass(frozen=True)
class Sampling:
    """How an evaluation samples: Euler steps, the seed of every sample's noise, the timestep shift, CFG and
    hybrid sampling. A table records it (``table["sampling"]``), and two tables compare only when theirs match."""

    num_steps: int
    seed: int = 0
    shift: float | None = None
    guidance_scale: float | None = None
    p_mix: float | None = None

    @classmethod
    def of(cls, config: EvaluationConfig, shift: float | None) -> Sampling:
        """The sampling of an evaluation config at the stage's resolved shift."""
        return cls(config.num_steps, config.seed, shift, config.guidance_scale, config.p_mix)


@torch.no_grad()
def generate(
    *,
    encode: Callable[[list[str]], Conditioning],
    decode: Callable[[Tensor], np.ndarray],
    policy: VelocityModel,
    prompts: Sequence[str],
    latent_shape: Sequence[int],
    sampling: Sampling,
    base: VelocityModel | None = None,
    micro_batch: int = 64,
    score: Callable[[np.ndarray, list[int]], Future[Any]] | None = None,
    progress: bool = False,
    condition: Callable[[list[int]], Conditioning] | None = None,
) -> tuple[np.ndarray, list[Any]]:
    """Images for ``prompts`` (``uint8 (N, H, W, 3)``), sample ``i`` from ``sample_noise(sampling.seed, i)``.

    Args:
        encode: prompts -> conditioning (e.g. :meth:`vgrpo.models.adapter.PipelineAdapter.encode_prompts`).
        decode: latents -> uint8 images.
        sampling: CFG against the empty prompt when ``guidance_scale`` is given and != 1; hybrid sampling with
            ``base`` when ``p_mix`` is given (both or neither).
        micro_batch: samples per forward pass (memory only: no image depends on it).
        score: called with each decoded chunk and its sample indices as soon as it exists (e.g.
            :meth:`vgrpo.rewards.multi.MultiReward.submit`), so rewards overlap the next chunk's sampling.
        progress: show a tqdm bar over the samples.
        condition: sample indices -> their conditioning, in place of ``encode`` of their prompts (:func:`evaluate`
            passes the adapter's ``encode_rows`` of their rows: an editing family's rows name condition images);
            guidance's empty prompt is still ``encode([""])``.

    Returns:
        The images and the futures ``score`` returned, in chunk order.
    """
    p_mix, guidance_scale = sampling.p_mix, sampling.guidance_scale
    if (base is None) != (p_mix is None):
        raise ValueError("hybrid sampling needs both `base` and `p_mix`")

    sigmas = timestep_grid(sampling.num_steps, shift=sampling.shift)
    model, base_model = policy, base
    if guidance_scale is not None and guidance_scale != 1.0:
        uncond = encode([""])
        model = ClassifierFreeGuidance(policy, uncond, guidance_scale)
        base_model = None if base is None else ClassifierFreeGuidance(base, uncond, guidance_scale)
    images, futures = [], []
    bar = tqdm(total=len(prompts), desc="sampling", unit="img", disable=not progress)
    for start in range(0, len(prompts), micro_batch):
        idx = list(range(start, min(start + micro_batch, len(prompts))))
        cond = encode([prompts[i] for i in idx]) if condition is None else condition(idx)
        # drawn on the CPU (the same noise on every device), sampled where the conditioning is: the model's device
        noise = sample_noise(sampling.seed, idx, latent_shape).to(cond.prompt_embeds.device)
        if base_model is not None and p_mix is not None:
            latents = hybrid_euler_sample(model, base_model, noise, cond, sigmas, p_mix)
        else:
            latents = euler_ode_sample(model, noise, cond, sigmas)
        chunk = decode(latents)
        if score is not None:
            futures.append(score(chunk, idx))
        images.append(chunk)
        bar.update(len(idx))
    bar.close()
    return np.concatenate(images), futures


def evaluate(
    *,
    adapter: Any,
    policy: VelocityModel,
    metadata: Sequence[Metadata],
    rewards: MultiReward,
    group_size: int,
    sampling: Sampling,
    base: VelocityModel | None = None,
    micro_batch: int = 64,
    overlap: bool = True,
    progress: bool = False,
) -> tuple[dict[str, Any], np.ndarray]:
    """Sample ``group_size`` images for each metadata row's ``prompt`` (prompt-major) and tabulate every
    reward (:func:`vgrpo.evaluation.tables.summarise`). ``adapter`` encodes prompts, decodes latents and knows the
    latent shape
    (:class:`vgrpo.models.adapter.PipelineAdapter`). With ``overlap``, chunk ``k`` is scored on the reward thread
    while chunk ``k + 1`` is sampled.

    Returns:
        The table (with the sampling settings and seconds spent) and the images.
    """
    expanded = [md for md in metadata for _ in range(group_size)]
    prompts = [str(md["prompt"]) for md in expanded]
    meta = expanded if rewards.needs_metadata else None

    def score(chunk: np.ndarray, idx: list[int]) -> Future[MultiRewardOutput]:
        return rewards.submit(chunk, [prompts[i] for i in idx], None if meta is None else [meta[i] for i in idx])

    t0 = time.perf_counter()
    images, futures = generate(
        encode=adapter.encode_prompts,
        decode=adapter.decode_samples,  # a video family's: uint8 frames (N, T, H, W, 3)
        policy=policy,
        prompts=prompts,
        latent_shape=adapter.latent_shape,
        sampling=sampling,
        base=base,
        micro_batch=micro_batch,
        score=score if overlap else None,
        progress=progress,
        condition=lambda idx: adapter.encode_rows([expanded[i] for i in idx]),
    )
    t1 = time.perf_counter()
    scored = MultiRewardOutput.concatenate([f.result() for f in futures]) if overlap else rewards(images, prompts, meta)
    t2 = time.perf_counter()
    table = summarise(scored, prompts, expanded, rewards, group_size=group_size)
    table["sampling"] = asdict(sampling)
    table["seconds"] = {"sampling": t1 - t0, "scoring_after_sampling": t2 - t1, "total": t2 - t0}
    table["seconds"] |= {f"reward_{k}": v for k, v in scored.seconds.items()}
    return table, images


def resized_adapter(adapter: Any, resolution: int | None, num_frames: int | None = None) -> Any:
    """``adapter`` (:class:`vgrpo.models.adapter.PipelineAdapter`) at the evaluation's image side, sharing its
    pipeline and its prompt cache (:meth:`~vgrpo.models.adapter.PipelineAdapter.resized`), and a video family's at
    the evaluation's ``num_frames`` (:meth:`vgrpo.models.wan.WanAdapter.with_frames`); ``adapter`` itself when both
    are None or its own.

    Raises:
        ValueError: naming ``evaluation.resolution`` when it is not a multiple of the VAE factor times the patch size,
            ``evaluation.num_frames`` for an image family or frames the VAE cannot decode.
    """
    if num_frames is not None and num_frames != getattr(adapter, "num_frames", None):
        if not hasattr(adapter, "with_frames"):
            raise ValueError(f"evaluation.num_frames is for video families; {type(adapter).__name__} samples images")
        try:
            adapter = adapter.with_frames(num_frames)
        except ValueError as exc:
            raise ValueError(f"evaluation.{exc}") from exc
    if resolution is None or resolution == adapter.resolution:
        return adapter
    try:
        return adapter.resized(resolution)
    except ValueError as exc:
        raise ValueError(f"evaluation.{exc}") from exc


def sampling_shift(
    setting: float | str,
    adapter: Any,
    *,
    rollout_shift: float | None,
    rollout_dynamic: bool = False,
    num_steps: int | None = None,
) -> float | None:
    """The static shift an evaluation samples with on ``adapter`` (at the evaluation's resolution), by its
    ``evaluation.shift`` ``setting``: a number as given; ``"dynamic"`` FLUX's resolution-dependent shift at the
    adapter's token count (and, for FLUX.2, the evaluation's ``num_steps``); ``"rollout"`` the rollout's rule:
    ``rollout_shift``, or the dynamic shift again when the rollout's is dynamic (``rollout_dynamic``)."""
    if setting == "dynamic" or (setting == "rollout" and rollout_dynamic):
        return float(adapter.dynamic_shift(num_steps))
    if setting == "rollout":
        return rollout_shift
    return float(setting)


@dataclass
class Evaluator:
    """The evaluation routine of a stage (:func:`evaluate`): fixed prompts, seeds and rewards, the base model for
    hybrid sampling (FLUX, ``p_mix``) when configured, and the rollout's shift (``shift``, resolved; with
    ``dynamic_shift`` FLUX's rule, recomputed at the evaluation's resolution). Each call samples at
    ``config.resolution`` (None: the adapter's, the rollout's) with :func:`sampling_shift` of ``config.shift``,
    scoring on the reward thread while it samples only with ``config.overlap``."""

    rows: list[dict[str, Any]]
    rewards: MultiReward
    config: EvaluationConfig
    shift: float | None
    base: nn.Module | None = None
    dynamic_shift: bool = False

    def sampling(self, adapter: Any) -> tuple[Any, Sampling]:
        """The adapter at the evaluation's resolution and the :class:`Sampling` it is evaluated with."""
        adapter = resized_adapter(adapter, self.config.resolution, self.config.num_frames)
        shift = sampling_shift(
            self.config.shift,
            adapter,
            rollout_shift=self.shift,
            rollout_dynamic=self.dynamic_shift,
            num_steps=self.config.num_steps,
        )
        return adapter, Sampling.of(self.config, shift)

    def __call__(self, adapter: Any, policy: nn.Module, iteration: int) -> tuple[dict[str, Any], np.ndarray]:
        adapter, sampling = self.sampling(adapter)
        table, images = evaluate(
            adapter=adapter,
            policy=policy,
            metadata=self.rows,
            rewards=self.rewards,
            group_size=self.config.group_size,
            sampling=sampling,
            base=self.base,
            micro_batch=self.config.micro_batch,
            overlap=self.config.overlap,
        )
        table["iteration"] = iteration
        return table, images
