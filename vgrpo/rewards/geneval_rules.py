"""GenEval's verdict rules: detections -> clause checks -> the strict score and Flow-GRPO's partial-credit
training reward, as pure functions of an image's detections (the rewards of :mod:`vgrpo.rewards.geneval` and
:mod:`vgrpo.rewards.geneval_server` score with them).

One scoring module for every detector (:mod:`vgrpo.rewards.detectors`: the embedded world's exact detector,
Mask2Former + CLIP colour for real images, recorded detections). It follows two public references exactly:

* GenEval (Ghosh et al. 2023, ``evaluation/evaluate_images.py``): per class, detections above a confidence
  threshold (0.3; 0.9 for the ``counting`` tag) sorted by confidence, at most 16; an include clause needs the
  ``count`` most confident objects of its class, all of the requested colour, each in the requested relation
  (box centres, a dead zone of 0.1 x the summed box sides) to every object of the referenced clause; an
  exclude clause needs fewer than ``count`` objects of its class. :func:`geneval_correct`.
* The Flow-GRPO reward server (Liu et al. 2025, ``reward_server/gen_eval.py``, ``evaluate_reward``): per
  include clause ``1 - |count - found| / count`` over every detection of the class (not clamped: too many
  objects can score below 0); when ``found != count`` a clause with a colour or position adds one 0; else a
  colour adds ``1 - |count - n_colour| / count`` and a position adds 0 on the first failing pair followed by
  the server's unconditional 1 (so a failed relation averages 0.5 over its two entries; reproduced as the
  server computes it, since that is the reward Flow-GRPO, DiffusionNFT and V-GRPO trained on). Exclude
  clauses do not enter the reward. The reward is the mean of the entries; its ``strict_correct`` (every
  count exact, every colour and relation right) is :attr:`GenEvalScore.exact`. :func:`flow_grpo_reward`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgrpo.rewards.base import Metadata
from vgrpo.rewards.clauses import Box, Detection, extra_objects, relative_position

__all__ = [
    "GenEvalScore",
    "GenEvalThresholds",
    "Objects",
    "flow_grpo_reward",
    "geneval_correct",
    "score_detections",
    "select_objects",
]

Objects = dict[str, list[Detection]]
"""Class name -> the kept detections of that class, most confident first (GenEval's ``detected``)."""


@dataclass(frozen=True)
class GenEvalThresholds:
    """GenEval's detection filter (``evaluate_images.py`` defaults, also the reward server's)."""

    confidence: float = 0.3
    counting_confidence: float = 0.9
    max_objects: int = 16
    nms_iou: float = 1.0
    """Greedy per-class NMS threshold; 1.0 (GenEval's default) keeps overlapping boxes."""
    position: float = 0.1
    """Dead zone of :func:`relative_position` as a fraction of the summed box sides."""


@dataclass(frozen=True)
class GenEvalScore:
    """GenEval's verdicts for one image.

    Attributes:
        correct: GenEval's strict correctness (:func:`geneval_correct`): what the benchmark reports.
        exact: the reward server's ``strict_correct`` (every include count exact, colours and relations right).
        reward: the server's partial credit (:func:`flow_grpo_reward`), the training reward.
        reasons: why ``correct`` is False (GenEval's wording), empty when it holds.
        extra: objects kept (:func:`select_objects`) beyond those the include clauses name
            (:func:`vgrpo.rewards.clauses.extra_objects`); none of the verdicts reads it.
    """

    correct: bool
    exact: bool
    reward: float
    reasons: tuple[str, ...] = ()
    extra: int = 0


def _iou(a: Box, b: Box) -> float:
    # GenEval's compute_iou: inclusive pixel boxes.
    def area(box: Sequence[float]) -> float:
        return max(box[2] - box[0] + 1, 0) * max(box[3] - box[1] + 1, 0)

    inter = area([max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])])
    union = area(a) + area(b) - inter
    return inter / union if union else 0.0


def select_objects(
    detections: Sequence[Detection], tag: str, thresholds: GenEvalThresholds = GenEvalThresholds()
) -> Objects:
    """GenEval's filter: per class, confidence above the tag's threshold, most confident first, at most
    ``max_objects``, then greedy NMS (a no-op at ``nms_iou = 1``)."""
    cutoff = thresholds.counting_confidence if tag == "counting" else thresholds.confidence
    by_class: dict[str, list[Detection]] = {}
    for det in sorted(detections, key=lambda d: -d.score):  # stable: ties keep the detector's order
        if det.score > cutoff:
            by_class.setdefault(det.label, []).append(det)
    objects: Objects = {}
    for label, dets in by_class.items():
        ordering, kept = dets[: thresholds.max_objects], []
        while ordering:
            best = ordering.pop(0)
            kept.append(best)
            if thresholds.nms_iou < 1:
                ordering = [d for d in ordering if _iou(best.box, d.box) < thresholds.nms_iou]
        objects[label] = kept
    return objects


def _colors(found: Sequence[Detection], req: Mapping[str, Any]) -> list[str]:
    missing = [d for d in found if d.color is None]
    if missing:
        raise ValueError(
            f"a colour clause ({req['color']} {req['class']}) needs detections with colours; the detector left "
            f"{len(missing)} of class {req['class']!r} without one"
        )
    return [str(d.color) for d in found]


def _relation_fails(
    found: Sequence[Detection], targets: Sequence[Detection], rel: str, threshold: float
) -> tuple[str, ...] | None:
    """The relations actually found for the first pair that violates ``rel``, or None when all hold."""
    for obj in found:
        for target in targets:
            rels = relative_position(obj, target, threshold)
            if rel not in rels:
                return tuple(sorted(rels))
    return None


def geneval_correct(metadata: Metadata, objects: Objects, *, position_threshold: float = 0.1) -> tuple[bool, list[str]]:
    """GenEval's strict correctness of one image (``evaluate`` in ``evaluate_images.py``) and its reasons."""
    correct, reasons = True, []
    groups: list[list[Detection] | None] = []
    for req in metadata.get("include", []):
        cls, count = req["class"], int(req["count"])
        found = objects.get(cls, [])[:count]
        matched = len(found) >= count
        if not matched:
            reasons.append(f"expected {cls}>={count}, found {len(found)}")
        else:
            if "color" in req:
                colors = _colors(found, req)
                if colors.count(req["color"]) < count:
                    matched = False
                    reasons.append(f"expected {req['color']} {cls}>={count}, found {colors.count(req['color'])}")
            if "position" in req and matched:
                rel, ref = req["position"][0], int(req["position"][1])
                targets = groups[ref] if ref < len(groups) else None
                if targets is None:
                    matched = False
                    reasons.append(f"no target for {cls} to be {rel}")
                else:
                    failed = _relation_fails(found, targets, rel, position_threshold)
                    if failed is not None:
                        matched = False
                        reasons.append(f"expected {cls} {rel} target, found {' and '.join(failed)} target")
        correct = correct and matched
        groups.append(found if matched else None)
    for req in metadata.get("exclude", []):
        n = len(objects.get(req["class"], []))
        if n >= int(req["count"]):
            correct = False
            reasons.append(f"expected {req['class']}<{req['count']}, found {n}")
    return correct, reasons


def flow_grpo_reward(metadata: Metadata, objects: Objects, *, position_threshold: float = 0.1) -> tuple[bool, float]:
    """The Flow-GRPO reward server's ``(strict_correct, reward)`` for one image (module docstring)."""
    exact, entries = True, []
    groups: list[list[Detection] | None] = []
    for req in metadata.get("include", []):
        count = int(req["count"])
        found = objects.get(req["class"], [])
        entries.append(1 - abs(count - len(found)) / count)
        matched = len(found) == count
        if not matched:
            if "color" in req or "position" in req:
                entries.append(0.0)
        else:
            if "color" in req:
                n_color = _colors(found, req).count(req["color"])
                entries.append(1 - abs(count - n_color) / count)
                matched = n_color == count
            if "position" in req and matched:
                ref = int(req["position"][1])
                targets = groups[ref] if ref < len(groups) else None
                if targets is None:
                    matched = False
                    entries.append(0.0)
                else:
                    if _relation_fails(found, targets, req["position"][0], position_threshold) is not None:
                        matched = False
                        entries.append(0.0)
                    entries.append(1.0)  # the server appends 1.0 after its loop whatever the loop found
        exact = exact and matched
        groups.append(list(found) if matched else None)
    return exact, float(sum(entries) / len(entries)) if entries else 0.0


def score_detections(
    metadata: Metadata, detections: Sequence[Detection], thresholds: GenEvalThresholds = GenEvalThresholds()
) -> GenEvalScore:
    """All GenEval verdicts of one image from its raw detections."""
    objects = select_objects(detections, str(metadata.get("tag", "")), thresholds)
    correct, reasons = geneval_correct(metadata, objects, position_threshold=thresholds.position)
    exact, reward = flow_grpo_reward(metadata, objects, position_threshold=thresholds.position)
    extra = extra_objects(metadata, [det for kept in objects.values() for det in kept])
    return GenEvalScore(correct=correct, exact=exact, reward=reward, reasons=tuple(reasons), extra=extra)
