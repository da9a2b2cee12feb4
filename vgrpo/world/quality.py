"""How honest the world's GenEval detector is: exact on ground truth, blind to noise, and specific to its prompt.

The checks a GenEval analogue has to pass before its scores mean anything (GenEval's own detector is validated
against human judgement, Ghosh et al. 2023, Sec. 4): the strict score of ground-truth renders, of the same
renders sent through the base model's VAE (what a perfect generator could at best output), of uniform noise,
of ground-truth renders scored against another prompt of the same tag that asks for something else, and the
verdicts on mutated scenes whose truth is known (:func:`mutations`: a count, a colour, a shape or a position
changed), rendered and sent through the VAE. The OCR rows get the same treatment from the world's OCR reward
(:func:`ocr_check`): ground truth, its VAE round trip, and the reader's own noise floor.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vgrpo.images import images_to_tensor, tensor_to_images
from vgrpo.models.pipeline import load_sd3_pipeline
from vgrpo.models.sd3 import SD3Adapter
from vgrpo.rewards.clauses import GENEVAL_TAGS, Detection
from vgrpo.rewards.geneval_rules import score_detections
from vgrpo.rewards.registry import build_reward
from vgrpo.world.detect import detect
from vgrpo.world.prompts import Record, read_split
from vgrpo.world.render import pixel_box, render
from vgrpo.world.scene import CELL_CENTERS, COLORS, SHAPES, TEXT_BAND, Scene, grid_cells, object_at

__all__ = [
    "MUTATIONS",
    "WORLD_OCR_REWARD",
    "check_split",
    "detector_quality",
    "has_pair",
    "mutation_check",
    "mutations",
    "ocr_check",
    "perturbed",
    "vae_roundtrip",
    "wrong_prompts",
]

WORLD_OCR_REWARD: dict[str, Any] = {"name": "ocr", "options": {"line_box": [0.0, 1.0 - TEXT_BAND, 1.0, 1.0]}}
"""The world OCR reward as a params entry: PP-OCR's recogniser on the text band's line."""

MUTATIONS = ("count", "color", "shape", "moved")
"""How :func:`mutations` changes a ground-truth scene: an object of a clause's class removed or one added, an
object's colour or shape changed, two objects' places swapped."""


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


def has_pair(scene: Scene, pairs: Collection[tuple[str, str]]) -> bool:
    """Whether an object of ``scene`` is one of the ``(color, shape)`` ``pairs``."""
    return any((o.color, o.shape) in pairs for o in scene.objects)


def _truth(scene: Scene, size: int) -> list[Detection]:
    """A scene's objects as exact detections (what an exact detector would report)."""
    out = []
    for o in scene.objects:
        x0, y0, side = pixel_box(o, size)
        out.append(Detection(label=o.shape, box=(x0, y0, x0 + side, y0 + side), score=1.0, color=o.color))
    return out


def mutations(scene: Scene, rng: np.random.Generator) -> dict[str, Scene]:
    """One scene per :data:`MUTATIONS` kind the scene allows, each a small change to ``scene``: ``count`` removes a
    random object (or, from a one-object scene, adds one of its shape and colour in a free cell), ``color`` and
    ``shape`` give a random object another colour or shape, ``moved`` swaps the places of two objects of different
    kinds. Whether a mutant still satisfies its prompt is for the verdicts on its exact objects to say."""
    objects = list(scene.objects)
    out: dict[str, Scene] = {}
    if objects:
        i = int(rng.integers(len(objects)))
        if len(objects) > 1:
            out["count"] = Scene(tuple(o for j, o in enumerate(objects) if j != i), scene.text)
        else:
            taken = {(o.x, o.y) for o in objects}
            free = [
                c for c in grid_cells(scene.text is not None) if (CELL_CENTERS[c[0]], CELL_CENTERS[c[1]]) not in taken
            ]
            cell = free[int(rng.integers(len(free)))]
            out["count"] = Scene((*objects, object_at(cell, objects[0].shape, objects[0].color)), scene.text)
        o = objects[i]
        color = [c for c in COLORS if c != o.color][int(rng.integers(len(COLORS) - 1))]
        shape = [s for s in SHAPES if s != o.shape][int(rng.integers(len(SHAPES) - 1))]
        out["color"] = Scene(tuple(replace(o, color=color) if j == i else p for j, p in enumerate(objects)), scene.text)
        out["shape"] = Scene(tuple(replace(o, shape=shape) if j == i else p for j, p in enumerate(objects)), scene.text)
    kinds = [(o.shape, o.color) for o in objects]
    pairs = [(a, b) for a in range(len(objects)) for b in range(a + 1, len(objects)) if kinds[a] != kinds[b]]
    if pairs:
        a, b = pairs[int(rng.integers(len(pairs)))]
        swapped = list(objects)
        swapped[a] = replace(objects[a], x=objects[b].x, y=objects[b].y)
        swapped[b] = replace(objects[b], x=objects[a].x, y=objects[a].y)
        out["moved"] = Scene(tuple(swapped), scene.text)
    return out


def mutation_check(
    records: Sequence[Record],
    roundtrip: Callable[[np.ndarray], np.ndarray] | None = None,
    *,
    held_out: Collection[tuple[str, str]] = (),
    seed: int = 0,
    size: int = 32,
) -> dict[str, Any]:
    """The detector's verdicts on the GenEval rows of ``records`` and on their :func:`mutations`, each rendered and
    (with ``roundtrip``) sent through a VAE, against the truth: the verdict of the scene's exact objects.

    Args:
        held_out: ``(color, shape)`` pairs the VAE never saw in training; scenes with one are counted apart.

    Returns:
        ``accuracy`` (share of verdicts that match the truth), ``false_credit`` (share of the scenes the truth
        fails that the detector credits), ``missed_credit`` (share of the scenes the truth credits that it fails),
        each also ``per_kind`` (``ground_truth`` and each mutation), and the number of ``scenes``: over the scenes
        without a ``held_out`` pair, and (when some have one) the same rates over those under ``held_out_pairs``.
    """
    rng = np.random.default_rng(seed)
    cases: list[tuple[str, dict[str, Any], Scene]] = []
    for md, scene in records:
        if md.get("tag") not in GENEVAL_TAGS:
            continue
        cases.append(("ground_truth", md, scene))
        cases += [(kind, md, mutant) for kind, mutant in mutations(scene, rng).items()]
    images = np.stack([render(scene, size) for _, _, scene in cases])
    if roundtrip is not None:
        images = roundtrip(images)
    truth = np.array([score_detections(md, _truth(scene, size)).correct for _, md, scene in cases])
    verdict = np.array([score_detections(md, detect(im)).correct for (_, md, _), im in zip(cases, images, strict=True)])
    kinds = np.array([kind for kind, _, _ in cases])
    unseen = np.array([has_pair(scene, held_out) for _, _, scene in cases], dtype=bool)

    def rates(sel: np.ndarray) -> dict[str, float | int]:
        t, v = truth[sel], verdict[sel]
        return {
            "accuracy": float((t == v).mean()),
            "false_credit": float(v[~t].mean()) if (~t).any() else 0.0,
            "missed_credit": float((~v[t]).mean()) if t.any() else 0.0,
            "scenes": int(sel.sum()),
            "truth_credited": int(t.sum()),
        }

    out: dict[str, Any] = {
        **rates(~unseen),
        "per_kind": {k: rates((kinds == k) & ~unseen) for k in ("ground_truth", *MUTATIONS)},
    }
    if unseen.any():
        out["held_out_pairs"] = rates(unseen)
    return out


def detector_quality(
    records: Sequence[Record],
    *,
    seed: int = 0,
    roundtrip: Callable[[np.ndarray], np.ndarray] | None = None,
    held_out: Collection[tuple[str, str]] = (),
    size: int = 32,
) -> dict[str, Any]:
    """GenEval strict accuracy of the world detector on the GenEval rows of ``records`` (``(metadata, scene)``).

    Args:
        records: world prompts with their ground-truth scenes (e.g. a test split).
        seed: seed of the uniform-noise images.
        roundtrip: uint8 ``(N, H, W, 3)`` -> the same images encoded and decoded by a VAE; adds ``vae_roundtrip``.
        held_out: ``(color, shape)`` pairs the VAE never saw in training (a prompt that names no colour can have
            a scene with one): ``vae_roundtrip`` is over the other scenes, ``vae_roundtrip_held_out_pairs`` over
            these.
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
    unseen = np.array([has_pair(scene, held_out) for _, scene in rows], dtype=bool)
    scores = {"ground_truth": strict(metadata, renders), "noise": strict(metadata, noise)}
    trips = strict(metadata, roundtrip(renders)) if roundtrip is not None else None
    out: dict[str, Any] = {name: float(v.mean()) for name, v in scores.items()}
    if trips is not None:
        out["vae_roundtrip"] = float(trips[~unseen].mean())
        if unseen.any():
            out["vae_roundtrip_held_out_pairs"] = float(trips[unseen].mean())
            out["images_held_out_pairs"] = int(unseen.sum())
    has_wrong = np.array([w is not None for w in wrong])
    wrong_scores = strict(wrong, renders)
    out["wrong_prompt"] = float(wrong_scores.mean())
    out["per_tag"] = {
        tag: {
            **{name: float(v[tags == tag].mean()) for name, v in scores.items()},
            **({} if trips is None else {"vae_roundtrip": float(trips[(tags == tag) & ~unseen].mean())}),
            "wrong_prompt": float(wrong_scores[tags[has_wrong] == tag].mean()),
        }
        for tag in GENEVAL_TAGS
        if (tags == tag).any()
    }
    out["images"] = len(rows)
    return out


def perturbed(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``images`` with every pixel channel moved by -1, 0 or +1 intensity level at random (clipped): a change no
    reader should see."""
    step = rng.integers(-1, 2, size=images.shape)
    return np.clip(images.astype(np.int16) + step, 0, 255).astype(np.uint8)


def ocr_check(
    records: Sequence[Record],
    roundtrip: Callable[[np.ndarray], np.ndarray] | None = None,
    *,
    seed: int = 0,
    size: int = 32,
) -> dict[str, Any]:
    """The world OCR reward (PP-OCR's recogniser on the text band) on the ground-truth renders of the OCR rows of
    ``records`` and, with ``roundtrip``, on the same renders sent through a VAE; and the reader's noise floor on the
    images it last scored (each perturbed by :func:`perturbed`).

    Returns:
        ``ground_truth`` and ``vae_roundtrip`` (mean score), ``*_exact`` (share read exactly), ``changed_by_one_level``
        (share of images whose score the perturbation changes), ``noise_abs_change`` and the number of ``images``;
        empty when ``records`` has no OCR rows.
    """
    rows = [(md, scene) for md, scene in records if md.get("tag") == "ocr"]
    if not rows:
        return {}
    reward = build_reward(WORLD_OCR_REWARD["name"], WORLD_OCR_REWARD["options"])
    metadata = [md for md, _ in rows]
    prompts = [str(md["prompt"]) for md in metadata]

    def score(images: np.ndarray) -> np.ndarray:
        return np.asarray(reward(images, prompts, metadata).scores, dtype=np.float64)

    images = np.stack([render(scene, size) for _, scene in rows])
    truth = score(images)
    out: dict[str, Any] = {"ground_truth": float(truth.mean()), "ground_truth_exact": float((truth == 1.0).mean())}
    last = truth
    if roundtrip is not None:
        images = roundtrip(images)
        last = score(images)
        out |= {"vae_roundtrip": float(last.mean()), "vae_roundtrip_exact": float((last == 1.0).mean())}
    change = score(perturbed(images, np.random.default_rng(seed))) - last
    out |= {
        "changed_by_one_level": float((change != 0).mean()),
        "noise_abs_change": float(np.abs(change).mean()),
        "images": len(rows),
    }
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


def check_split(
    path: str | Path, pipeline_dir: str | Path | None = None, held_out: Collection[tuple[str, str]] = ()
) -> dict[str, Any]:
    """:func:`detector_quality`, :func:`mutation_check` and :func:`ocr_check` of a world split file (rows with their
    ground-truth scenes), with the VAE round trips of the pipeline in ``pipeline_dir`` when given, scenes with a
    ``held_out`` pair counted apart; the result names its inputs."""
    records = read_split(path)
    roundtrip = vae_roundtrip(pipeline_dir) if pipeline_dir is not None else None
    pairs = {(str(c), str(s)) for c, s in held_out}
    quality = detector_quality(records, roundtrip=roundtrip, held_out=pairs)
    quality["mutations"] = mutation_check(records, roundtrip, held_out=pairs)
    quality["ocr"] = ocr_check(records, roundtrip)
    return quality | {
        "prompts": str(path),
        "pipeline": None if pipeline_dir is None else str(pipeline_dir),
        "held_out_pairs": sorted(pairs),
    }
