"""Evaluation of a pipeline on the world's test prompts: the GenEval-style per-tag table and the OCR score.

GenEval's overall score is the mean of the per-tag accuracies (Ghosh et al. 2023); ``partial`` is the
Flow-GRPO training reward averaged the same way. ``varied_group_frac`` is the fraction of prompts whose
``group_size`` samples do not all get the same partial-credit reward: GRPO learns nothing from a prompt
whose group is constant, so this says how much signal a base model leaves for RL.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from vgrpo.rewards.geneval import GENEVAL_TAGS, score_detections
from vgrpo.rewards.ocr import RapidOCRReader, ocr_score
from vgrpo.world.detect import detect
from vgrpo.world.prompts import write_text_atomic

__all__ = ["evaluate_world", "score_world_images", "summarise", "write_json_atomic"]

Sampler = Callable[[list[str]], np.ndarray]
"""``prompts -> uint8 images (N, H, W, 3)``."""


def score_world_images(
    metadata: Sequence[dict[str, Any]], images: np.ndarray, ocr: RapidOCRReader | None = None
) -> list[dict[str, Any]]:
    """One row per image: ``tag``, ``strict`` (0/1) and ``partial`` for GenEval tags, ``ocr`` for OCR prompts."""
    rows: list[dict[str, Any]] = []
    ocr_idx = [i for i, md in enumerate(metadata) if md["tag"] == "ocr"]
    texts = dict(zip(ocr_idx, ocr.read([images[i] for i in ocr_idx]), strict=True)) if ocr and ocr_idx else {}
    for i, (md, image) in enumerate(zip(metadata, images, strict=True)):
        if md["tag"] == "ocr":
            if ocr is not None:
                rows.append({"tag": "ocr", "ocr": ocr_score(texts[i], md["text"]), "text": texts[i]})
            continue
        verdict = score_detections(md, detect(image))
        rows.append({"tag": md["tag"], "strict": float(verdict.correct), "partial": verdict.reward})
    return rows


def summarise(rows: Sequence[dict[str, Any]], group_size: int) -> dict[str, Any]:
    """The per-tag table and overall scores from :func:`score_world_images` rows laid out prompt-major
    (``group_size`` consecutive rows per prompt)."""
    by_tag: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_tag[row["tag"]].append(row)
    per_tag = {
        tag: {
            "strict": float(np.mean([r["strict"] for r in by_tag[tag]])),
            "partial": float(np.mean([r["partial"] for r in by_tag[tag]])),
            "images": len(by_tag[tag]),
        }
        for tag in GENEVAL_TAGS
        if by_tag.get(tag)
    }
    out: dict[str, Any] = {"per_tag": per_tag}
    if per_tag:
        out["geneval_strict"] = float(np.mean([v["strict"] for v in per_tag.values()]))
        out["geneval_partial"] = float(np.mean([v["partial"] for v in per_tag.values()]))
        varied = []
        geneval_rows = [r for r in rows if r["tag"] != "ocr"]
        for g in range(0, len(geneval_rows), group_size):
            group = [r["partial"] for r in geneval_rows[g : g + group_size]]
            varied.append(float(max(group) > min(group)))
        out["varied_group_frac"] = float(np.mean(varied))
    if by_tag.get("ocr"):
        out["ocr"] = float(np.mean([r["ocr"] for r in by_tag["ocr"]]))
        out["ocr_images"] = len(by_tag["ocr"])
    return out


def evaluate_world(
    sample: Sampler,
    metadata: Sequence[dict[str, Any]],
    *,
    group_size: int,
    ocr: RapidOCRReader | None = None,
) -> tuple[dict[str, Any], np.ndarray]:
    """Sample ``group_size`` images per prompt of ``metadata`` (prompt-major), score and summarise them.

    Returns the summary and the images (for grids)."""
    expanded = [md for md in metadata for _ in range(group_size)]
    images = sample([md["prompt"] for md in expanded])
    summary = summarise(score_world_images(expanded, images, ocr), group_size)
    summary["prompts"] = len(metadata)
    summary["group_size"] = group_size
    return summary, images


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write ``data`` as indented JSON atomically (:func:`vgrpo.world.prompts.write_text_atomic`)."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
