"""The one reward interface: a batch of images, their prompts and metadata in; one score per image out.

Every reward of the project -- GenEval, OCR, the CLIP-family preference models, VLM judges behind HTTP,
and the embedded world's learned models -- subclasses :class:`Reward` and implements :meth:`Reward.score`.
:meth:`Reward.__call__` validates the input once and the output always, so a reward model that returns a
wrong shape or a non-finite score is reported by its name instead of poisoning an advantage three functions later:
a non-finite score as :class:`NonFiniteRewardError` (a training stage skips the iteration), anything else that is not
``N`` numbers as :class:`RewardFailed` (a :class:`vgrpo.errors.UserError`: one line naming the reward and what it
returned). :class:`vgrpo.rewards.multi.MultiReward` turns whatever a reward raises into a :class:`RewardFailed` too,
naming the reward's key, its import name and where it raised.

Images are ``uint8`` arrays ``(N, H, W, 3)`` in RGB: what a decoded rollout is, what every engine here
(PP-OCR, detectors, CLIP processors, HTTP servers) takes, and cheap to hand to a worker thread.

A reward also answers, from its class and its options alone (nothing is built), what the rest of the project asks
about it: whether a prompt file suits it (:meth:`Reward.check_prompts`, run before any compute), which flat
evaluation metrics are its headline (:meth:`Reward.headline_columns`), and how an evaluation table summarises its
scores beyond their mean (:meth:`Reward.summarise`, :meth:`Reward.add_gains`, :meth:`Reward.table_lines`). The
defaults suit a reward with one score; GenEval (:class:`vgrpo.rewards.geneval.GenEvalBase`) overrides them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np

from vgrpo.rewards.failures import (
    NonFiniteRewardError,
    RewardError,
    RewardFailed,
    TransientRewardError,
    TransientRewardFailed,
    describe_raised,
    describe_value,
    repr_of,
)

__all__ = [
    "HeadlineColumn",
    "Interval",
    "Metadata",
    "NonFiniteRewardError",
    "PairedScores",
    "PromptScores",
    "Reward",
    "RewardError",
    "RewardFailed",
    "RewardOutput",
    "TransientRewardError",
    "TransientRewardFailed",
    "check_images",
    "describe_raised",
    "describe_value",
    "plain_scores",
    "repr_of",
    "with_interval",
]

Metadata = Mapping[str, Any]
"""Per-image prompt metadata: GenEval's ``tag`` / ``include`` / ``exclude``, the world's ``text``, ..."""


@dataclass(frozen=True)
class RewardOutput:
    """What a reward returns for ``N`` images.

    Attributes:
        scores: ``(N,)`` float64, the score that training and evaluation use.
        sub_scores: name -> ``(N,)`` float64, the parts it was made from or diagnostics beside it
            (GenEval's ``strict`` and ``partial``, OCR's edit distance, ...); logged, never trained on.
    """

    scores: np.ndarray
    sub_scores: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class _PlainScores(RewardOutput):
    """What a reward function returned in place of a :class:`RewardOutput`, unchecked: :meth:`Reward.__call__`
    checks it, and names it as returned (not as ``scores``)."""


def plain_scores(value: Any) -> RewardOutput:
    """A reward function's return value (``N`` scores, unchecked) as the :class:`RewardOutput` that
    :meth:`Reward.__call__` checks: a failure names the value as what the function returned."""
    return _PlainScores(scores=value)


def check_images(images: Any) -> np.ndarray:
    """``images`` as a ``uint8 (N, H, W, 3)`` array, or a ``ValueError`` saying what was received."""
    arr = np.asarray(images)
    if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[-1] != 3:
        raise ValueError(f"rewards take uint8 RGB images of shape (N, H, W, 3), got {arr.dtype} {arr.shape}")
    return arr


@dataclass(frozen=True)
class HeadlineColumn:
    """One headline number of a reward's evaluation (:meth:`Reward.headline_columns`).

    Attributes:
        name: its short name in ``dvc metrics show`` (``strict``, ``ocr``, ``pickscore``).
        metric: the flat evaluation metric it reads (:func:`vgrpo.evaluation.tables.flat_metrics`: ``eval/KEY``,
            ``eval/KEY_geneval_strict``).
        gain: a paired gain over a baseline evaluation, present only in an evaluation compared with one.
    """

    name: str
    metric: str
    gain: bool = False


class Interval(Protocol):
    """The 95% bootstrap interval of the mean of per-prompt ``values`` (resampled within ``strata``, one label per
    prompt, when given; the statistic is then the mean of the stratum means); None for no values."""

    def __call__(self, values: np.ndarray, strata: np.ndarray | None = None) -> list[float] | None: ...


@dataclass(frozen=True)
class PromptScores:
    """One reward's scores in an evaluation of ``P`` prompts: what :meth:`Reward.summarise` reads.

    Attributes:
        by_prompt: ``"mean"`` (the reward's score) and each sub-score -> ``(P,)``, the mean over each prompt's
            samples.
        applies: ``(P,)`` bool, the prompts the reward applies to (:meth:`Reward.applies_to`, every sample).
        tags: ``(P,)`` str, each prompt's ``tag`` (``"None"`` without one).
        group_size: samples per prompt.
        interval: the table's bootstrap interval over prompts (:mod:`vgrpo.evaluation.stats`).
    """

    by_prompt: Mapping[str, np.ndarray]
    applies: np.ndarray
    tags: np.ndarray
    group_size: int
    interval: Interval


@dataclass(frozen=True)
class PairedScores:
    """One reward's per-prompt scores in two evaluations of the same prompts (``None`` where the reward does not
    apply): what :meth:`Reward.add_gains` reads.

    Attributes:
        mine: ``"mean"`` and each sub-score -> per-prompt values of the evaluation gaining.
        theirs: the same of the baseline.
        tags: ``(P,)`` str, each prompt's ``tag``.
        interval: the table's bootstrap interval over prompts (:mod:`vgrpo.evaluation.stats`).
    """

    mine: Mapping[str, Sequence[float | None]]
    theirs: Mapping[str, Sequence[float | None]]
    tags: np.ndarray
    interval: Interval

    def difference(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Per-prompt ``mine - theirs`` of score ``name`` over the prompts both score, and the ``(P,)`` mask of
        those prompts."""
        a, b = self.mine[name], self.theirs[name]
        ok = np.array([x is not None and y is not None for x, y in zip(a, b, strict=True)])
        return np.array([x - y for x, y in zip(a, b, strict=True) if x is not None and y is not None]), ok


def with_interval(value: float | None, ci: Sequence[float] | None, digits: int = 3) -> str:
    """``value [low, high]`` as evaluation tables print it; ``n/a`` for no value."""
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}" + (f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else "")


class Reward(ABC):
    """Base class of every reward.

    Subclasses set :attr:`name` (the registry name, used in errors and logs), :attr:`needs_metadata` when
    :meth:`score` reads ``metadata``, and implement :meth:`score`. Rewards are stateless between calls, so
    one instance may score batches from several threads when its engine allows (:attr:`thread_safe`).

    The class methods answer before any reward is built (preflight, prompt preparation, evaluation tables of
    files), from the class and its params ``options``; override them for a reward that needs more than one mean.
    """

    name: ClassVar[str] = "reward"
    needs_metadata: ClassVar[bool] = False
    thread_safe: ClassVar[bool] = True
    credit_sub_scores: ClassVar[tuple[str, ...]] = ()
    """Sub-scores that say whether the reward credits an image (1.0: credited), the first one present counts:
    evaluation tables record it per image (``per_prompt.credited``) and image grids frame credited images.
    Empty: a reward without a verdict (a learned preference)."""
    summarised_sub_scores: ClassVar[tuple[str, ...]] = ()
    """Sub-scores that :meth:`summarise` reports in its own way; evaluation tables leave out their plain means."""

    @property
    def reads_metadata(self) -> bool:
        """Whether :meth:`score` reads the prompt rows when they are given (a caller gives them when any of its
        rewards reads them); every reward that :attr:`needs_metadata` does."""
        return self.needs_metadata

    @classmethod
    def check_prompts(cls, rows: Sequence[Metadata], path: str | Path, options: Mapping[str, Any]) -> list[str]:
        """What is wrong with prompt rows ``rows`` (read from ``path``) for this reward built with ``options``:
        problems naming the file and row, each one line; empty when the rows suit it. Run on every row of a prompt
        file before any compute (preflight, the stage's prompt preparation). Default: none."""
        return []

    @classmethod
    def headline_columns(cls, key: str, options: Mapping[str, Any]) -> tuple[HeadlineColumn, ...]:
        """The headline numbers of this reward under ``key`` in an evaluation (a curriculum's summary table, the
        columns of ``dvc metrics show``). Default: its mean ``eval/KEY``, named :attr:`name` (``key`` for a class
        that does not set one)."""
        return (HeadlineColumn(cls.name if cls.name != Reward.name else key, f"eval/{key}"),)

    @classmethod
    def summarise(cls, scores: PromptScores) -> dict[str, Any]:
        """What an evaluation table adds to this reward's entry beyond the mean, its interval, the image count, the
        mean of each sub-score (but :attr:`summarised_sub_scores`) and the groups that vary. A ``per_tag`` field
        (tag -> row of numbers) is a breakdown by prompt tag; flat metrics report its rows' numbers that come with an
        interval (``NAME`` beside ``NAME_ci``) as ``eval/KEY_TAG_NAME``. Default: nothing."""
        return {}

    @classmethod
    def add_gains(cls, entry: dict[str, Any], baseline: Mapping[str, Any], paired: PairedScores) -> None:
        """Add to ``entry`` (this reward's table entry, with its ``gain`` over the baseline already) the gains of
        what :meth:`summarise` added, over ``baseline`` (the baseline evaluation's entry). Default: nothing."""
        return None

    @classmethod
    def table_lines(cls, key: str, entry: Mapping[str, Any], gains: bool) -> list[str]:
        """Lines an evaluation table prints for this reward under ``key`` before every reward's one-line mean
        (with the gain columns when ``gains``). Default: none."""
        return []

    def applies_to(self, prompt: str, metadata: Metadata | None) -> bool:
        """Whether this reward means anything for ``prompt`` (GenEval needs GenEval clauses, OCR a quoted
        text); evaluation tables average each reward over the prompts it applies to. Default: every prompt."""
        return True

    @abstractmethod
    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        """Scores of ``images`` (``uint8 (N, H, W, 3)``) against ``prompts`` (``N``) and ``metadata``."""

    def __call__(self, images: Any, prompts: Sequence[str], metadata: Sequence[Metadata] | None = None) -> RewardOutput:
        """The checked scores of ``images``: a ``ValueError`` for bad input (images, prompt and metadata counts);
        :class:`RewardFailed` when :meth:`score` returns anything but ``N`` numbers (and ``N`` of each sub-score);
        :class:`NonFiniteRewardError` for NaN or Inf scores. What :meth:`score` raises propagates as it is
        (:class:`vgrpo.rewards.multi.MultiReward` names it)."""
        arr = check_images(images)
        n = arr.shape[0]
        if len(prompts) != n:
            raise ValueError(f"reward {self.name!r}: {n} images but {len(prompts)} prompts")
        if metadata is not None and len(metadata) != n:
            raise ValueError(f"reward {self.name!r}: {n} images but {len(metadata)} metadata rows")
        if self.needs_metadata and metadata is None:
            raise ValueError(f"reward {self.name!r} needs per-image metadata (GenEval clauses, OCR text, ...)")
        if n == 0:
            return RewardOutput(scores=np.zeros(0))
        return self._checked(self.score(arr, list(prompts), metadata), n)

    def _numbers(self, what: str | None, value: Any, n: int) -> np.ndarray:
        """``value`` as ``(n,)`` float64; :class:`RewardFailed` naming it (``what``: ``scores``, a sub-score, or
        ``None`` for a function's plain return value) otherwise."""
        not_numbers = f"returned {what + ' ' if what else ''}{describe_value(value)}, expected ({n},) numbers"
        try:
            arr = np.asarray(value)
        except Exception as exc:  # ragged nested lists, objects whose __array__ fails
            raise RewardFailed(self.name, not_numbers) from exc
        if value is None or arr.dtype.kind not in "biuf":  # strings, None, objects, complex numbers
            raise RewardFailed(self.name, not_numbers)
        if arr.shape != (n,):
            subject, shown = (what, describe_value(value)) if what else (type(value).__name__, repr_of(value))
            raise RewardFailed(self.name, f"returned {subject} of shape {arr.shape}, expected ({n},) numbers: {shown}")
        return np.asarray(arr, dtype=np.float64)

    def _checked(self, out: Any, n: int) -> RewardOutput:
        if not isinstance(out, RewardOutput):
            raise RewardFailed(self.name, f"returned {describe_value(out)}, expected a RewardOutput of ({n},) scores")
        plain = isinstance(out, _PlainScores)
        scores = self._numbers(None if plain else "scores", out.scores, n)
        if not np.isfinite(scores).all():
            bad = np.flatnonzero(~np.isfinite(scores)).tolist()
            error = NonFiniteRewardError(
                f"reward/{self.name}",
                {"count": len(bad), "of": n, "indices": bad[:16]},
                message=f"reward {self.name!r} returned non-finite scores at images {bad[:10]}",
            )
            error.scores = scores
            raise error
        if not isinstance(out.sub_scores, Mapping):
            raise RewardFailed(self.name, f"returned sub_scores {describe_value(out.sub_scores)}, expected a dict")
        subs = {k: self._numbers(f"sub_scores[{k!r}]", v, n) for k, v in out.sub_scores.items()}
        return RewardOutput(scores=scores, sub_scores=subs)
