"""Evaluation: sample a fixed prompt set with fixed seeds, score every image with every reward, write a table.

What the pipeline's evaluate task runs after each stage, and what the paper's tables report: GenEval per tag
(strict, the overall score the mean of the per-tag accuracies, Ghosh et al. 2023), OCR accuracy over OCR
prompts, and the mean of each preference reward over the prompts it applies to. Sampling is the RL rollout's
Euler ODE, optionally with classifier-free guidance (the paper reports SD3.5-M with and without CFG) and with
MixGRPO's hybrid sampling (the trained model for the first ``p_mix * T`` steps, the base for the rest; the
paper's FLUX evaluation uses ``p_mix = 0.8``).

Every sample's initial noise comes from its own generator seeded by ``(seed, sample index)``, so an image does
not depend on the micro-batch size or on which other prompts are evaluated with it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vgrpo.flow import timestep_grid
from vgrpo.policy import Conditioning, VelocityModel
from vgrpo.rewards.base import Metadata
from vgrpo.rewards.geneval import GENEVAL_TAGS
from vgrpo.rewards.multi import MultiReward, MultiRewardOutput
from vgrpo.samplers import ClassifierFreeGuidance, euler_ode_sample, hybrid_euler_sample

__all__ = ["evaluate", "flat_metrics", "generate", "grid_image", "sample_noise", "summarise", "write_grid"]


def sample_noise(seed: int, indices: Sequence[int], latent_shape: Sequence[int]) -> Tensor:
    """``(len(indices), *latent_shape)`` standard normal noise, row ``k`` a function of ``(seed, indices[k])``."""
    rows = []
    for i in indices:
        state = int(np.random.SeedSequence([seed, i]).generate_state(1, dtype=np.uint64)[0] >> 1)
        rows.append(torch.randn(*latent_shape, generator=torch.Generator().manual_seed(state)))
    return torch.stack(rows)


@torch.no_grad()
def generate(
    *,
    encode: Callable[[list[str]], Conditioning],
    decode: Callable[[Tensor], np.ndarray],
    policy: VelocityModel,
    prompts: Sequence[str],
    latent_shape: Sequence[int],
    num_steps: int,
    seed: int,
    shift: float | None = None,
    guidance_scale: float | None = None,
    base: VelocityModel | None = None,
    p_mix: float | None = None,
    micro_batch: int = 64,
    score: Callable[[np.ndarray, list[int]], Future[Any]] | None = None,
    progress: bool = False,
) -> tuple[np.ndarray, list[Any]]:
    """Images for ``prompts`` (``uint8 (N, H, W, 3)``), sample ``i`` from :func:`sample_noise` ``(seed, i)``.

    Args:
        encode: prompts -> conditioning (e.g. :meth:`vgrpo.models.pipeline.PipelineAdapter.encode_prompts`).
        decode: latents -> uint8 images.
        guidance_scale: CFG against the empty prompt when given and != 1.
        base, p_mix: hybrid sampling, both or neither.
        score: called with each decoded chunk and its sample indices as soon as it exists (e.g.
            :meth:`vgrpo.rewards.multi.MultiReward.submit`), so rewards overlap the next chunk's sampling.
        progress: show a tqdm bar over the samples.

    Returns:
        The images and the futures ``score`` returned, in chunk order.
    """
    if (base is None) != (p_mix is None):
        raise ValueError("hybrid sampling needs both `base` and `p_mix`")
    from tqdm.auto import tqdm

    sigmas = timestep_grid(num_steps, shift=shift)
    model, base_model = policy, base
    if guidance_scale is not None and guidance_scale != 1.0:
        uncond = encode([""])
        model = ClassifierFreeGuidance(policy, uncond, guidance_scale)
        base_model = None if base is None else ClassifierFreeGuidance(base, uncond, guidance_scale)
    images, futures = [], []
    bar = tqdm(total=len(prompts), desc="sampling", unit="img", disable=not progress)
    for start in range(0, len(prompts), micro_batch):
        idx = list(range(start, min(start + micro_batch, len(prompts))))
        cond = encode([prompts[i] for i in idx])
        noise = sample_noise(seed, idx, latent_shape)
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


def _mean(values: np.ndarray) -> float | None:
    """Mean, or None (JSON null) for no values: a reward that applies to no prompt has no score."""
    return float(values.mean()) if values.size else None


def summarise(
    scored: MultiRewardOutput,
    prompts: Sequence[str],
    metadata: Sequence[Metadata],
    rewards: MultiReward,
    *,
    group_size: int,
) -> dict[str, Any]:
    """The evaluation table from the scores of ``N = len(prompts)`` images laid out prompt-major
    (``group_size`` consecutive samples per prompt).

    Per reward key: ``mean`` of the raw score over the images the reward applies to
    (:meth:`vgrpo.rewards.base.Reward.applies_to`), the mean of each sub-score, the image count and
    ``varied_group_frac`` (prompts whose samples do not all score the same: GRPO learns nothing from the
    others). For a GenEval reward also the per-tag table of ``strict`` and ``partial`` and the overall
    scores, GenEval's mean of the per-tag accuracies.
    """
    n = len(prompts)
    if n % group_size:
        raise ValueError(f"{n} samples are not whole groups of {group_size}")
    table: dict[str, Any] = {"samples": n, "prompts": n // group_size, "group_size": group_size, "rewards": {}}
    for key, term in rewards.terms.items():
        mask = np.array([term.reward.applies_to(p, md) for p, md in zip(prompts, metadata, strict=True)])
        raw = scored.raw[key]
        entry: dict[str, Any] = {"mean": _mean(raw[mask]), "images": int(mask.sum())}
        subs = {k.split("/", 1)[1]: v for k, v in scored.sub_scores.items() if k.startswith(f"{key}/")}
        entry.update({sub: _mean(v[mask]) for sub, v in subs.items() if sub not in ("strict", "partial")})
        groups = raw.reshape(-1, group_size)[mask.reshape(-1, group_size).all(1)]
        entry["varied_group_frac"] = _mean((groups.max(1) > groups.min(1)).astype(float))
        if {"strict", "partial"} <= set(subs):
            by_tag: dict[str, list[int]] = defaultdict(list)
            for i, md in enumerate(metadata):
                if mask[i]:
                    by_tag[str(md.get("tag"))].append(i)
            per_tag = {
                tag: {"strict": _mean(subs["strict"][ix]), "partial": _mean(subs["partial"][ix]), "images": len(ix)}
                for tag in GENEVAL_TAGS
                if (ix := by_tag.get(tag))
            }
            entry["per_tag"] = per_tag
            if per_tag:
                entry["geneval_strict"] = float(np.mean([v["strict"] or 0.0 for v in per_tag.values()]))
                entry["geneval_partial"] = float(np.mean([v["partial"] or 0.0 for v in per_tag.values()]))
        table["rewards"][key] = entry
    return table


def evaluate(
    *,
    adapter: Any,
    policy: VelocityModel,
    metadata: Sequence[Metadata],
    rewards: MultiReward,
    group_size: int,
    num_steps: int,
    seed: int,
    shift: float | None = None,
    guidance_scale: float | None = None,
    base: VelocityModel | None = None,
    p_mix: float | None = None,
    micro_batch: int = 64,
    overlap: bool = True,
    progress: bool = False,
) -> tuple[dict[str, Any], np.ndarray]:
    """Sample ``group_size`` images for each metadata row's ``prompt`` (prompt-major) and tabulate every
    reward (:func:`summarise`). ``adapter`` encodes prompts, decodes latents and knows the latent shape
    (:class:`vgrpo.models.pipeline.PipelineAdapter`). With ``overlap``, chunk ``k`` is scored on the reward thread
    while chunk ``k + 1`` is sampled.

    Returns:
        The table (with the sampling settings and seconds spent) and the images.
    """
    import time

    from vgrpo.world.data import tensor_to_images

    expanded = [md for md in metadata for _ in range(group_size)]
    prompts = [str(md["prompt"]) for md in expanded]
    meta = expanded if rewards.needs_metadata else None

    def score(chunk: np.ndarray, idx: list[int]) -> Future[MultiRewardOutput]:
        return rewards.submit(chunk, [prompts[i] for i in idx], None if meta is None else [meta[i] for i in idx])

    t0 = time.perf_counter()
    images, futures = generate(
        encode=adapter.encode_prompts,
        decode=lambda z: tensor_to_images(adapter.decode(z)),
        policy=policy,
        prompts=prompts,
        latent_shape=adapter.latent_shape,
        num_steps=num_steps,
        seed=seed,
        shift=shift,
        guidance_scale=guidance_scale,
        base=base,
        p_mix=p_mix,
        micro_batch=micro_batch,
        score=score if overlap else None,
        progress=progress,
    )
    t1 = time.perf_counter()
    scored = MultiRewardOutput.concatenate([f.result() for f in futures]) if overlap else rewards(images, prompts, meta)
    t2 = time.perf_counter()
    table = summarise(scored, prompts, expanded, rewards, group_size=group_size)
    table["sampling"] = {
        "num_steps": num_steps,
        "seed": seed,
        "shift": shift,
        "guidance_scale": guidance_scale,
        "p_mix": p_mix,
    }
    table["seconds"] = {"sampling": t1 - t0, "scoring_after_sampling": t2 - t1, "total": t2 - t0}
    table["seconds"] |= {f"reward_{k}": v for k, v in scored.seconds.items()}
    return table, images


def grid_image(images: np.ndarray, cols: int, scale: int = 4) -> np.ndarray:
    """``images`` tiled ``cols`` per row, a 1-pixel black frame each, nearest-neighbour upscaled ``scale``
    times: ``uint8 (rows * (H + 2) * scale, cols * (W + 2) * scale, 3)``."""
    n, h, w, _ = images.shape
    rows = -(-n // cols)
    grid = np.zeros((rows * (h + 2), cols * (w + 2), 3), np.uint8)
    for k, image in enumerate(images):
        r, c = divmod(k, cols)
        grid[r * (h + 2) + 1 : r * (h + 2) + 1 + h, c * (w + 2) + 1 : c * (w + 2) + 1 + w] = image
    return grid.repeat(scale, 0).repeat(scale, 1)


def write_grid(path: str | Path, images: np.ndarray, cols: int, scale: int = 4) -> None:
    """:func:`grid_image` as a PNG, written atomically."""
    import os
    import tempfile

    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".png")
    os.close(fd)
    try:
        Image.fromarray(grid_image(images, cols, scale)).save(tmp, format="PNG")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def flat_metrics(table: Mapping[str, Any]) -> dict[str, float]:
    """The headline numbers of a :func:`summarise` table as flat ``eval/...`` floats (for MLflow, DVC)."""
    out: dict[str, float] = {}
    for key, entry in table["rewards"].items():
        for name, value in entry.items():
            if isinstance(value, int | float) and name != "images":
                out[f"eval/{key}_{name}" if name != "mean" else f"eval/{key}"] = float(value)
        for tag, row in entry.get("per_tag", {}).items():
            out[f"eval/{key}_{tag}_strict"] = float(row["strict"])
    return out
