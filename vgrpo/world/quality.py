"""How honest the world's GenEval detector is: exact on ground truth, blind to noise, and specific to its prompt.

The checks a GenEval analogue has to pass before its scores mean anything (GenEval's own detector is validated
against human judgement, Ghosh et al. 2023, Sec. 4): the strict score of ground-truth renders, of the same
renders sent through the base model's VAE (what a perfect generator could at best output), of uniform noise,
and of ground-truth renders scored against another prompt of the same tag that asks for something else.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vgrpo.images import images_to_tensor, tensor_to_images
from vgrpo.models.pipeline import load_sd3_pipeline
from vgrpo.models.sd3 import SD3Adapter
from vgrpo.rewards.clauses import GENEVAL_TAGS
from vgrpo.rewards.geneval_rules import score_detections
from vgrpo.world.detect import detect
from vgrpo.world.prompts import Record, read_split
from vgrpo.world.render import render

__all__ = ["check_split", "detector_quality", "vae_roundtrip", "wrong_prompts"]


def _requirement(metadata: dict[str, Any]) -> list[str]:
    return sorted(json.dumps(c, sort_keys=True) for c in [*metadata["include"], *metadata.get("exclude", [])])


def wrong_prompts(metadata: Sequence[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """For each GenEval row, the next row of the same tag (cyclically) whose clauses differ, or None when no row
    of its tag asks for something else."""
    out: list[dict[str, Any] | None] = []
    for i, md in enumerate(metadata):
        same_tag = [m for m in [*metadata[i + 1 :], *metadata[:i]] if m.get("tag") == md.get("tag")]
        out.append(next((m for m in same_tag if _requirement(m) != _requirement(md)), None))
    return out


def detector_quality(
    records: Sequence[Record],
    *,
    seed: int = 0,
    roundtrip: Callable[[np.ndarray], np.ndarray] | None = None,
    size: int = 32,
) -> dict[str, Any]:
    """GenEval strict accuracy of the world detector on the GenEval rows of ``records`` (``(metadata, scene)``).

    Args:
        records: world prompts with their ground-truth scenes (e.g. a test split).
        seed: seed of the uniform-noise images.
        roundtrip: uint8 ``(N, H, W, 3)`` -> the same images encoded and decoded by a VAE; adds ``vae_roundtrip``.
        size: render resolution.

    Returns:
        ``ground_truth``, ``noise``, ``wrong_prompt`` (each the mean strict score) with ``per_tag`` values of each,
        ``vae_roundtrip`` when ``roundtrip`` is given, and the number of ``images``.
    """
    rows = [(md, scene) for md, scene in records if md.get("tag") in GENEVAL_TAGS]
    if not rows:
        raise ValueError("detector_quality needs GenEval rows (tags single_object .. color_attr)")
    metadata = [md for md, _ in rows]
    renders = np.stack([render(scene, size) for _, scene in rows])
    noise = np.random.default_rng(seed).integers(0, 256, size=renders.shape, dtype=np.uint8)
    wrong = wrong_prompts(metadata)

    def strict(mds: Sequence[dict[str, Any] | None], images: np.ndarray) -> np.ndarray:
        return np.array([score_detections(md, detect(im)).correct for md, im in zip(mds, images, strict=True) if md])

    tags = np.array([md["tag"] for md in metadata])
    scores = {"ground_truth": strict(metadata, renders), "noise": strict(metadata, noise)}
    if roundtrip is not None:
        scores["vae_roundtrip"] = strict(metadata, roundtrip(renders))
    out: dict[str, Any] = {name: float(v.mean()) for name, v in scores.items()}
    has_wrong = np.array([w is not None for w in wrong])
    wrong_scores = strict(wrong, renders)
    out["wrong_prompt"] = float(wrong_scores.mean())
    out["per_tag"] = {
        tag: {
            **{name: float(v[tags == tag].mean()) for name, v in scores.items()},
            "wrong_prompt": float(wrong_scores[tags[has_wrong] == tag].mean()),
        }
        for tag in GENEVAL_TAGS
        if (tags == tag).any()
    }
    out["images"] = len(rows)
    return out


def vae_roundtrip(pipeline_dir: str | Path) -> Callable[[np.ndarray], np.ndarray]:
    """uint8 ``(N, H, W, 3)`` images -> the same encoded and decoded by the VAE of the SD3 pipeline in
    ``pipeline_dir`` (posterior samples from one generator seeded 0)."""
    adapter = SD3Adapter(load_sd3_pipeline(pipeline_dir))
    generator = torch.Generator().manual_seed(0)

    @torch.no_grad()
    def roundtrip(images: np.ndarray) -> np.ndarray:
        latents = adapter.encode_images(images_to_tensor(images), generator=generator)
        return tensor_to_images(adapter.decode(latents))

    return roundtrip


def check_split(path: str | Path, pipeline_dir: str | Path | None = None) -> dict[str, Any]:
    """:func:`detector_quality` of a world split file (rows with their ground-truth scenes), with the VAE round
    trips of the pipeline in ``pipeline_dir`` when given; the result names both inputs."""
    records = read_split(path)
    roundtrip = vae_roundtrip(pipeline_dir) if pipeline_dir is not None else None
    quality = detector_quality(records, roundtrip=roundtrip)
    return quality | {"prompts": str(path), "pipeline": None if pipeline_dir is None else str(pipeline_dir)}
