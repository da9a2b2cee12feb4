"""GenEval as a reward: the world's or Mask2Former's detections of each image scored by GenEval's verdict rules
(:mod:`vgrpo.rewards.geneval_rules`): GenEval's strict correctness and the Flow-GRPO reward server's partial credit.

What GenEval rewards (this one and Flow-GRPO's server, :mod:`vgrpo.rewards.geneval_server`) answer before scoring
and in evaluation tables is :class:`GenEvalBase`: prompt rows checked against the clause format and the scoring
detector's vocabulary, the headline ``strict`` / ``partial`` / ``strict_gain``, and the table's per-tag accuracies
with the overall score GenEval reports, the mean of the per-tag accuracies (its interval from a bootstrap within
tags), and their paired gains over a baseline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
from vgrpo.rewards.clauses import GENEVAL_TAGS, clause_problem, vocabulary_problem
from vgrpo.rewards.detectors import Detector, build_detector, detector_vocabulary
from vgrpo.rewards.geneval_rules import GenEvalScore, GenEvalThresholds, score_detections

__all__ = ["GenEvalBase", "GenEvalReward"]


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
        extra_object_penalty: clutter priced in [not in the paper]: the score loses this much per object the
            detector keeps beyond those the prompt names (:func:`vgrpo.rewards.clauses.extra_objects`, any class or
            colour), after shaping; the sub-score ``extra_objects`` is that count. GenEval's verdict checks that
            the named objects are there, not that nothing else is, so without it a policy adds objects for free.
            A penalty, not a stricter verdict: it reaches the partial and shaped scores that stages train on,
            grades one extra object from three, and leaves ``strict`` GenEval's own. 0 (default): off.
    """

    name = "geneval"

    def __init__(
        self,
        detector: Any = "world",
        detector_options: Mapping[str, Any] | None = None,
        reward: Literal["partial", "strict", "exact"] = "partial",
        thresholds: Mapping[str, Any] | None = None,
        shaping_detectors: Sequence[Mapping[str, Any]] | None = None,
        extra_object_penalty: float = 0.0,
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
        if not 0 <= extra_object_penalty < float("inf"):
            raise ValueError(f"reward {self.name!r}: extra_object_penalty must be >= 0, got {extra_object_penalty!r}")
        self.extra_object_penalty = float(extra_object_penalty)

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
        verdicts = self.verdicts(images, metadata)
        subs = self._sub_scores(verdicts)
        scores = subs[self.reward]
        if self.shaping:
            levels = [subs[self.reward]]
            for detector in self.shaping:
                levels.append(self._sub_scores(self.verdicts(images, metadata, detector))[self.reward])
            subs["shaped"] = scores = np.mean(levels, axis=0)
        if self.extra_object_penalty:
            # Counted by the reward's own detector: a looser shaping detector would call near-miss blobs objects.
            subs["extra_objects"] = np.array([float(v.extra) for v in verdicts])
            scores = scores - self.extra_object_penalty * subs["extra_objects"]
        return RewardOutput(scores=scores, sub_scores=subs)
