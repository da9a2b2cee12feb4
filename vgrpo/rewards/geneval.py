"""GenEval: detections -> clause checks -> the strict score and Flow-GRPO's partial-credit training reward.

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

What GenEval rewards (this one and Flow-GRPO's server, :mod:`vgrpo.rewards.geneval_server`) answer before scoring
and in evaluation tables is :class:`GenEvalBase`: prompt rows checked against the clause format and the scoring
detector's vocabulary, the headline ``strict`` / ``partial`` / ``strict_gain``, and the table's per-tag accuracies
with the overall score GenEval reports, the mean of the per-tag accuracies (its interval from a bootstrap within
tags), and their paired gains over a baseline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from vgrpo.rewards.base import (
    HeadlineColumn,
    Metadata,
    PairedScores,
    PromptScores,
    Reward,
    RewardOutput,
    with_interval,
)
from vgrpo.rewards.clauses import GENEVAL_TAGS, Box, Detection, clause_problem, relative_position, vocabulary_problem
from vgrpo.rewards.detectors import Detector, build_detector, detector_vocabulary

__all__ = [
    "GenEvalBase",
    "GenEvalReward",
    "GenEvalScore",
    "GenEvalThresholds",
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
    """

    correct: bool
    exact: bool
    reward: float
    reasons: tuple[str, ...] = ()


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
    return GenEvalScore(correct=correct, exact=exact, reward=reward, reasons=tuple(reasons))


class GenEvalBase(Reward):
    """What a GenEval reward answers from its class and options (:class:`vgrpo.rewards.base.Reward`'s class
    methods): its sub-scores ``strict`` (GenEval's correctness) and ``partial`` (the server's partial credit), and
    ``exact``; subclasses name the detector that scores their clauses (:meth:`detector_name`)."""

    needs_metadata: ClassVar[bool] = True
    credit_sub_scores: ClassVar[tuple[str, ...]] = ("strict", "exact")
    summarised_sub_scores: ClassVar[tuple[str, ...]] = ("strict", "partial")

    @classmethod
    def detector_name(cls, options: Mapping[str, Any]) -> Any:
        """The name of the detector that scores the clauses with ``options`` (:mod:`vgrpo.rewards.detectors`)."""
        return options.get("detector", "world")

    @classmethod
    def check_prompts(cls, rows: Sequence[Metadata], path: str | Path, options: Mapping[str, Any]) -> list[str]:
        """The first row whose clauses are malformed (:func:`vgrpo.rewards.clauses.clause_problem`), else the
        classes and colours the clauses name that the scoring detector cannot see."""
        malformed = clause_problem(rows, path)
        if malformed is not None:
            return [malformed]
        vocabulary = detector_vocabulary(cls.detector_name(options))
        unknown = None if vocabulary is None else vocabulary_problem(rows, path, vocabulary)
        return [] if unknown is None else [unknown]

    @classmethod
    def headline_columns(cls, key: str, options: Mapping[str, Any]) -> tuple[HeadlineColumn, ...]:
        """GenEval's overall ``strict`` and ``partial`` scores, and the ``strict_gain`` over a baseline."""
        return (
            HeadlineColumn("strict", f"eval/{key}_geneval_strict"),
            HeadlineColumn("partial", f"eval/{key}_geneval_partial"),
            HeadlineColumn("strict_gain", f"eval/{key}_geneval_strict_gain", gain=True),
        )

    @classmethod
    def summarise(cls, scores: PromptScores) -> dict[str, Any]:
        """With ``strict`` and ``partial`` sub-scores: ``per_tag``, each GenEval tag's ``strict`` (with its interval),
        ``partial`` and image count, and the overall ``geneval_strict`` / ``geneval_partial``, GenEval's mean of the
        per-tag accuracies, with intervals from a bootstrap over prompts within tags."""
        by_prompt, applies, tags = scores.by_prompt, scores.applies, scores.tags
        if not {"strict", "partial"} <= set(by_prompt):
            return {}
        per_tag = {}
        for tag in GENEVAL_TAGS:
            rows = applies & (tags == tag)
            if rows.any():
                per_tag[tag] = {
                    "strict": float(by_prompt["strict"][rows].mean()),
                    "strict_ci": scores.interval(by_prompt["strict"][rows]),
                    "partial": float(by_prompt["partial"][rows].mean()),
                    "images": int(rows.sum() * scores.group_size),
                }
        out: dict[str, Any] = {"per_tag": per_tag}
        if per_tag:
            strata = tags[applies]
            out["geneval_strict"] = float(np.mean([v["strict"] for v in per_tag.values()]))
            out["geneval_strict_ci"] = scores.interval(by_prompt["strict"][applies], strata)
            out["geneval_partial"] = float(np.mean([v["partial"] for v in per_tag.values()]))
            out["geneval_partial_ci"] = scores.interval(by_prompt["partial"][applies], strata)
        return out

    @classmethod
    def add_gains(cls, entry: dict[str, Any], baseline: Mapping[str, Any], paired: PairedScores) -> None:
        """``geneval_strict_gain`` (with its interval, paired by prompt within tags) and ``geneval_partial_gain``
        beside the overall scores, and ``strict_gain`` (with its interval) in each tag's row."""
        if "per_tag" not in entry:
            return
        d, ok = paired.difference("strict")
        tags = paired.tags[ok]
        entry["geneval_strict_gain"] = entry["geneval_strict"] - baseline["geneval_strict"]
        entry["geneval_strict_gain_ci"] = paired.interval(d, tags)
        entry["geneval_partial_gain"] = entry["geneval_partial"] - baseline["geneval_partial"]
        for tag, row in entry["per_tag"].items():
            row["strict_gain"] = float(d[tags == tag].mean())
            row["strict_gain_ci"] = paired.interval(d[tags == tag])

    @classmethod
    def table_lines(cls, key: str, entry: Mapping[str, Any], gains: bool) -> list[str]:
        """The per-tag table (strict with its interval, partial, images, and the strict gain) and the overall line."""
        if "per_tag" not in entry:
            return []
        header = f"{key + ' tag':<16}{'strict [95% CI]':>24}{'partial':>9}{'images':>8}"
        lines = [header + (f"{'gain [95% CI]':>26}" if gains else "")]
        for tag, row in entry["per_tag"].items():
            gain = f"{with_interval(row['strict_gain'], row['strict_gain_ci']):>26}" if gains else ""
            strict = with_interval(row["strict"], row["strict_ci"])
            lines.append(f"{tag:<16}{strict:>24}{row['partial']:>9.3f}{row['images']:>8d}{gain}")
        gain = f"{with_interval(entry['geneval_strict_gain'], entry['geneval_strict_gain_ci']):>34}" if gains else ""
        strict = with_interval(entry["geneval_strict"], entry["geneval_strict_ci"])
        lines.append(f"{'overall':<16}{strict:>24}{entry['geneval_partial']:>9.3f}{gain}")
        return lines


class GenEvalReward(GenEvalBase):
    """GenEval as a reward: ``sub_scores`` are ``strict`` (GenEval's correctness, what the benchmark reports),
    ``exact`` (the reward server's ``strict_correct``) and ``partial`` (its partial credit); ``scores`` is the one
    that ``reward`` names (Flow-GRPO trains on ``partial``).

    Args:
        detector: ``"world"``, ``"mask2former"``, ``"recorded"`` (:func:`vgrpo.rewards.detectors.build_detector`)
            or a detector object.
        detector_options: keyword options of the named detector (local weight paths, device).
        reward: ``"partial"``, ``"strict"`` or ``"exact"``.
        thresholds: overrides of :class:`GenEvalThresholds` fields.
        shaping_detectors: reward shaping [not in the paper]: detector options (merged over ``detector_options``)
            of looser detectors; the score is then ``reward`` averaged over the detector and these, so that
            near-misses earn part of the credit. The sub-scores stay the detector's own; ``shaped`` is added.
            The embedded world's exact detector needs it: a rough blob that a learned detector would accept at
            GenEval's 0.3 confidence scores 0 there, which leaves most groups without signal.
    """

    name = "geneval"

    def __init__(
        self,
        detector: Any = "world",
        detector_options: Mapping[str, Any] | None = None,
        reward: Literal["partial", "strict", "exact"] = "partial",
        thresholds: Mapping[str, Any] | None = None,
        shaping_detectors: Sequence[Mapping[str, Any]] | None = None,
    ):
        self.detector = build_detector(detector, detector_options) if isinstance(detector, str) else detector
        if shaping_detectors and not isinstance(detector, str):
            raise ValueError(f"reward {self.name!r}: shaping_detectors needs the detector given by name")
        self.shaping = [
            build_detector(str(detector), {**dict(detector_options or {}), **dict(opts)})
            for opts in shaping_detectors or ()
        ]
        if reward not in ("partial", "strict", "exact"):
            raise ValueError(f"reward {self.name!r}: reward must be 'partial', 'strict' or 'exact', got {reward!r}")
        self.reward = reward
        self.thresholds = GenEvalThresholds(**dict(thresholds or {}))

    def applies_to(self, prompt: str, metadata: Metadata | None) -> bool:
        return metadata is not None and metadata.get("tag") in GENEVAL_TAGS

    def verdicts(
        self, images: np.ndarray, metadata: Sequence[Metadata], detector: Detector | None = None
    ) -> list[GenEvalScore]:
        """:class:`GenEvalScore` of each image, with GenEval's reasons for failures (by ``detector``, default the
        reward's own)."""
        detections = (detector or self.detector).detect(images, metadata)
        return [score_detections(md, dets, self.thresholds) for md, dets in zip(metadata, detections, strict=True)]

    @staticmethod
    def _sub_scores(verdicts: Sequence[GenEvalScore]) -> dict[str, np.ndarray]:
        return {
            "strict": np.array([float(v.correct) for v in verdicts]),
            "exact": np.array([float(v.exact) for v in verdicts]),
            "partial": np.array([v.reward for v in verdicts]),
        }

    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        assert metadata is not None  # checked by Reward.__call__
        subs = self._sub_scores(self.verdicts(images, metadata))
        if not self.shaping:
            return RewardOutput(scores=subs[self.reward], sub_scores=subs)
        levels = [subs[self.reward]]
        for detector in self.shaping:
            levels.append(self._sub_scores(self.verdicts(images, metadata, detector))[self.reward])
        subs["shaped"] = np.mean(levels, axis=0)
        return RewardOutput(scores=subs["shaped"], sub_scores=subs)
