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

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vgrpo.clauses import GENEVAL_TAGS
from vgrpo.flow import timestep_grid
from vgrpo.policy import Conditioning, VelocityModel
from vgrpo.rewards.base import Metadata
from vgrpo.rewards.multi import MultiReward, MultiRewardOutput
from vgrpo.samplers import ClassifierFreeGuidance, euler_ode_sample, hybrid_euler_sample
from vgrpo.seeding import derive_seed
from vgrpo.stats import bootstrap_ci

__all__ = [
    "compare",
    "evaluate",
    "flat_metrics",
    "generate",
    "grid_image",
    "grid_of",
    "sample_noise",
    "summarise",
    "write_grid",
]


def sample_noise(seed: int, indices: Sequence[int], latent_shape: Sequence[int]) -> Tensor:
    """``(len(indices), *latent_shape)`` standard normal noise, row ``k`` a function of ``(seed, indices[k])``."""
    rows = []
    for i in indices:
        state = derive_seed(seed, i)
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
        encode: prompts -> conditioning (e.g. :meth:`vgrpo.models.adapter.PipelineAdapter.encode_prompts`).
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


def _ci(values: np.ndarray, strata: Sequence[str] | np.ndarray | None = None) -> list[float] | None:
    """95% bootstrap interval over prompts (:func:`vgrpo.stats.bootstrap_ci`), or None for no values."""
    return list(bootstrap_ci(values, strata)) if values.size else None


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
    (:meth:`vgrpo.rewards.base.Reward.applies_to`) with ``mean_ci``, its 95% bootstrap interval over prompts
    (:mod:`vgrpo.stats`), the mean of each sub-score, the image count and ``varied_group_frac`` (prompts whose
    samples do not all score the same: GRPO learns nothing from the others). For a GenEval reward also the
    per-tag table of ``strict`` and ``partial`` (each with its interval) and the overall scores, GenEval's mean of
    the per-tag accuracies, with intervals from a bootstrap over prompts within tags.

    ``per_prompt`` holds what paired comparisons (:func:`compare`) and image grids need: each prompt, its tag,
    each reward's per-prompt mean score and sub-scores (None where the reward does not apply), and ``credited``,
    per image whether the verifiable reward credits it (GenEval strict, OCR exact read; None for prompts that
    only learned rewards score).
    """
    n = len(prompts)
    if n % group_size:
        raise ValueError(f"{n} samples are not whole groups of {group_size}")
    n_prompts = n // group_size
    table: dict[str, Any] = {"samples": n, "prompts": n_prompts, "group_size": group_size, "rewards": {}}
    tags = [str(md.get("tag")) for md in metadata[::group_size]]
    per_prompt: dict[str, Any] = {"prompt": list(prompts[::group_size]), "tag": tags}
    credited: list[list[bool | None]] = [[None] * group_size for _ in range(n_prompts)]
    for key, term in rewards.terms.items():
        mask = np.array([term.reward.applies_to(p, md) for p, md in zip(prompts, metadata, strict=True)])
        prompt_mask = np.asarray(mask.reshape(-1, group_size).all(axis=1), dtype=bool)
        raw = scored.raw[key]
        subs = {k.split("/", 1)[1]: v for k, v in scored.sub_scores.items() if k.startswith(f"{key}/")}
        by_prompt = {name: v.reshape(-1, group_size).mean(1) for name, v in {"mean": raw, **subs}.items()}
        entry: dict[str, Any] = {"mean": _mean(raw[mask]), "mean_ci": _ci(by_prompt["mean"][prompt_mask])}
        entry["images"] = int(mask.sum())
        entry.update({sub: _mean(v[mask]) for sub, v in subs.items() if sub not in ("strict", "partial")})
        groups = raw.reshape(-1, group_size)[prompt_mask]
        entry["varied_group_frac"] = _mean((groups.max(1) > groups.min(1)).astype(float))
        per_prompt[key] = {
            name: [float(x) if ok else None for x, ok in zip(v, prompt_mask, strict=True)]
            for name, v in by_prompt.items()
        }
        verdict = subs.get("strict", subs.get("exact"))
        if verdict is not None:
            for i in np.flatnonzero(mask):
                credited[i // group_size][i % group_size] = bool(verdict[i] == 1.0)
        if {"strict", "partial"} <= set(subs):
            ix_tags = np.array(tags)
            per_tag = {}
            for tag in GENEVAL_TAGS:
                rows = prompt_mask & (ix_tags == tag)
                if rows.any():
                    per_tag[tag] = {
                        "strict": float(by_prompt["strict"][rows].mean()),
                        "strict_ci": _ci(by_prompt["strict"][rows]),
                        "partial": float(by_prompt["partial"][rows].mean()),
                        "images": int(rows.sum() * group_size),
                    }
            entry["per_tag"] = per_tag
            if per_tag:
                strata = ix_tags[prompt_mask]
                entry["geneval_strict"] = float(np.mean([v["strict"] for v in per_tag.values()]))
                entry["geneval_strict_ci"] = _ci(by_prompt["strict"][prompt_mask], strata)
                entry["geneval_partial"] = float(np.mean([v["partial"] for v in per_tag.values()]))
                entry["geneval_partial_ci"] = _ci(by_prompt["partial"][prompt_mask], strata)
        table["rewards"][key] = entry
    per_prompt["credited"] = credited
    table["per_prompt"] = per_prompt
    return table


def _paired_differences(a: Sequence[float | None], b: Sequence[float | None]) -> tuple[np.ndarray, np.ndarray]:
    """Per-prompt ``a - b`` over the prompts both score, and the mask of those prompts."""
    ok = np.array([x is not None and y is not None for x, y in zip(a, b, strict=True)])
    return np.array([x - y for x, y in zip(a, b, strict=True) if x is not None and y is not None]), ok


def compare(table: dict[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    """Add to ``table`` its gains over ``baseline``, an evaluation of the same prompts with the same sampling
    settings, each with a 95% paired bootstrap interval over prompts (:mod:`vgrpo.stats`): ``gain`` and
    ``gain_ci`` beside each reward's ``mean``, ``geneval_strict_gain`` (``_ci``) and ``geneval_partial_gain``
    beside the overall GenEval scores, and ``strict_gain`` (``_ci``) in each tag's row. Returns ``table``.

    Raises:
        ValueError: when the two evaluations differ in prompts, group size or sampling settings.
    """
    mine, theirs = table["per_prompt"], baseline.get("per_prompt")
    if theirs is None:
        raise ValueError("the baseline evaluation has no per-prompt scores (written before they were recorded)")
    for field in ("prompt", "tag"):
        if mine[field] != theirs[field]:
            raise ValueError(f"the baseline evaluation has other prompts ({field} lists differ): no paired gains")
    for field in ("group_size", "sampling"):
        if table.get(field) != baseline.get(field):
            raise ValueError(
                f"the baseline evaluation has another {field}: {baseline.get(field)}, not {table.get(field)}"
            )
    tags = np.array(mine["tag"])
    for key, entry in table["rewards"].items():
        if key not in theirs or key not in baseline["rewards"]:
            continue
        d, _ = _paired_differences(mine[key]["mean"], theirs[key]["mean"])
        entry["gain"] = float(d.mean()) if d.size else None
        entry["gain_ci"] = _ci(d)
        if "per_tag" in entry:
            d, ok = _paired_differences(mine[key]["strict"], theirs[key]["strict"])
            entry["geneval_strict_gain"] = entry["geneval_strict"] - baseline["rewards"][key]["geneval_strict"]
            entry["geneval_strict_gain_ci"] = _ci(d, tags[ok])
            entry["geneval_partial_gain"] = entry["geneval_partial"] - baseline["rewards"][key]["geneval_partial"]
            for tag, row in entry["per_tag"].items():
                row["strict_gain"] = float(d[tags[ok] == tag].mean())
                row["strict_gain_ci"] = _ci(d[tags[ok] == tag])
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
    (:class:`vgrpo.models.adapter.PipelineAdapter`). With ``overlap``, chunk ``k`` is scored on the reward thread
    while chunk ``k + 1`` is sampled.

    Returns:
        The table (with the sampling settings and seconds spent) and the images.
    """
    import time

    from vgrpo.images import tensor_to_images

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


FRAME_COLORS: dict[bool | None, tuple[int, int, int]] = {True: (40, 200, 60), False: (200, 40, 40), None: (0, 0, 0)}
"""Frame of a grid image: credited by the verifiable reward (green), not credited (red), not verifiable (black)."""
CAPTION_HEIGHT = 14
"""Pixels of the caption strip under each grid row (PIL's built-in bitmap font, about 11 px high)."""


def grid_image(
    images: np.ndarray,
    cols: int,
    scale: int = 4,
    *,
    captions: Sequence[str] | None = None,
    credited: Sequence[bool | None] | None = None,
) -> np.ndarray:
    """``images`` tiled ``cols`` per row, each in a 1-pixel frame, nearest-neighbour upscaled ``scale`` times:
    ``uint8 (rows * ((H + 2) * scale + c), cols * (W + 2) * scale, 3)`` with ``c`` = :data:`CAPTION_HEIGHT`
    when ``captions`` (one per row, written under it) are given, else 0.

    ``credited`` (one per image) colours each frame by :data:`FRAME_COLORS`.
    """
    n, h, w, _ = images.shape
    rows = -(-n // cols)
    if captions is not None and len(captions) != rows:
        raise ValueError(f"{len(captions)} captions for {rows} grid rows")
    if credited is not None and len(credited) != n:
        raise ValueError(f"{len(credited)} credit marks for {n} images")
    tiles = np.zeros((rows * (h + 2), cols * (w + 2), 3), np.uint8)
    for k, image in enumerate(images):
        r, c = divmod(k, cols)
        y, x = r * (h + 2), c * (w + 2)
        tiles[y : y + h + 2, x : x + w + 2] = FRAME_COLORS[None if credited is None else credited[k]]
        tiles[y + 1 : y + 1 + h, x + 1 : x + 1 + w] = image
    tiles = tiles.repeat(scale, 0).repeat(scale, 1)
    if captions is None:
        return tiles
    from PIL import Image, ImageDraw

    row_h = (h + 2) * scale
    out = Image.new("RGB", (tiles.shape[1], rows * (row_h + CAPTION_HEIGHT)), (32, 32, 32))
    draw = ImageDraw.Draw(out)
    for r, caption in enumerate(captions):
        top = r * (row_h + CAPTION_HEIGHT)
        out.paste(Image.fromarray(tiles[r * row_h : (r + 1) * row_h]), (0, top))
        draw.text((3, top + row_h + 1), caption, fill=(235, 235, 235))
    return np.asarray(out)


def write_grid(
    path: str | Path,
    images: np.ndarray,
    cols: int,
    scale: int = 4,
    *,
    captions: Sequence[str] | None = None,
    credited: Sequence[bool | None] | None = None,
) -> None:
    """:func:`grid_image` as a PNG, written atomically."""
    import os
    import tempfile

    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".png")
    os.close(fd)
    try:
        Image.fromarray(grid_image(images, cols, scale, captions=captions, credited=credited)).save(tmp, format="PNG")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def grid_of(table: Mapping[str, Any], images: np.ndarray, prompts: int) -> dict[str, Any]:
    """Keyword arguments of :func:`grid_image` for the first ``prompts`` prompts of an evaluation ``table`` and
    its ``images``: a row per prompt, its caption, and the credit marks of ``per_prompt``."""
    group, detail = int(table["group_size"]), table["per_prompt"]
    rows = min(prompts, len(detail["prompt"]))
    return {
        "images": images[: rows * group],
        "cols": group,
        "captions": detail["prompt"][:rows],
        "credited": [mark for marks in detail["credited"][:rows] for mark in marks],
    }


def flat_metrics(table: Mapping[str, Any]) -> dict[str, float]:
    """The headline numbers of a :func:`summarise` table as flat ``eval/...`` floats (for MLflow, DVC)."""
    out: dict[str, float] = {}
    for key, entry in table["rewards"].items():
        for name, value in entry.items():
            flat = f"eval/{key}_{name}" if name != "mean" else f"eval/{key}"
            if isinstance(value, int | float) and name != "images":
                out[flat] = float(value)
            elif name.endswith("_ci") and isinstance(value, list):  # mean_ci -> eval/KEY_ci_low, eval/KEY_ci_high
                stem = f"eval/{key}_ci" if name == "mean_ci" else f"eval/{key}_{name}"
                out[f"{stem}_low"], out[f"{stem}_high"] = float(value[0]), float(value[1])
        for tag, row in entry.get("per_tag", {}).items():
            out[f"eval/{key}_{tag}_strict"] = float(row["strict"])
    return out
