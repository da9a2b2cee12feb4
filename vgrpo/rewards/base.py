"""The one reward interface: a batch of images, their prompts and metadata in; one score per image out.

Every reward of the project -- GenEval, OCR, the CLIP-family preference models, VLM judges behind HTTP,
and the embedded world's learned models -- subclasses :class:`Reward` and implements :meth:`Reward.score`.
:meth:`Reward.__call__` validates the input once and the output always, so a reward model that returns a
wrong shape or a non-finite score is reported by its name (:class:`RewardError`) instead of poisoning an
advantage three functions later.

Images are ``uint8`` arrays ``(N, H, W, 3)`` in RGB: what a decoded rollout is, what every engine here
(PP-OCR, detectors, CLIP processors, HTTP servers) takes, and cheap to hand to a worker thread.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from vgrpo.training.guards import NonFiniteError

__all__ = [
    "Metadata",
    "NonFiniteRewardError",
    "Reward",
    "RewardError",
    "RewardOutput",
    "TransientRewardError",
    "check_images",
]

Metadata = Mapping[str, Any]
"""Per-image prompt metadata: GenEval's ``tag`` / ``include`` / ``exclude``, the world's ``text``, ..."""


class RewardError(RuntimeError):
    """A reward returned something unusable (wrong shape, non-finite score) or its engine failed;
    the message names the reward."""


class TransientRewardError(RewardError):
    """A reward engine could not be reached or was overloaded (connection errors, timeouts, 429, 5xx) after its
    own retries: worth retrying later, unlike a refusal or a bad answer."""


class NonFiniteRewardError(RewardError, NonFiniteError):
    """A reward returned NaN or Inf scores: a training stage skips the iteration (:mod:`vgrpo.training.guards`).
    ``scores`` holds what it returned, for the event log."""

    scores: np.ndarray | None = None


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


def check_images(images: Any) -> np.ndarray:
    """``images`` as a ``uint8 (N, H, W, 3)`` array, or a ``ValueError`` saying what was received."""
    arr = np.asarray(images)
    if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[-1] != 3:
        raise ValueError(f"rewards take uint8 RGB images of shape (N, H, W, 3), got {arr.dtype} {arr.shape}")
    return arr


class Reward(ABC):
    """Base class of every reward.

    Subclasses set :attr:`name` (the registry name, used in errors and logs), :attr:`needs_metadata` when
    :meth:`score` reads ``metadata``, and implement :meth:`score`. Rewards are stateless between calls, so
    one instance may score batches from several threads when its engine allows (:attr:`thread_safe`).
    """

    name: ClassVar[str] = "reward"
    needs_metadata: ClassVar[bool] = False
    thread_safe: ClassVar[bool] = True

    def applies_to(self, prompt: str, metadata: Metadata | None) -> bool:
        """Whether this reward means anything for ``prompt`` (GenEval needs GenEval clauses, OCR a quoted
        text); evaluation tables average each reward over the prompts it applies to. Default: every prompt."""
        return True

    @abstractmethod
    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        """Scores of ``images`` (``uint8 (N, H, W, 3)``) against ``prompts`` (``N``) and ``metadata``."""

    def __call__(self, images: Any, prompts: Sequence[str], metadata: Sequence[Metadata] | None = None) -> RewardOutput:
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

    def _checked(self, out: RewardOutput, n: int) -> RewardOutput:
        if not isinstance(out, RewardOutput):
            raise RewardError(f"reward {self.name!r} returned {type(out).__name__}, expected RewardOutput")
        named = {"scores": out.scores, **{f"sub_scores[{k!r}]": v for k, v in out.sub_scores.items()}}
        checked: dict[str, np.ndarray] = {}
        for key, value in named.items():
            arr = np.asarray(value, dtype=np.float64)
            if arr.shape != (n,):
                raise RewardError(f"reward {self.name!r} returned {key} of shape {arr.shape}, expected ({n},)")
            if key == "scores" and not np.isfinite(arr).all():
                bad = np.flatnonzero(~np.isfinite(arr)).tolist()
                error = NonFiniteRewardError(
                    f"reward/{self.name}",
                    {"count": len(bad), "of": n, "indices": bad[:16]},
                    message=f"reward {self.name!r} returned non-finite scores at images {bad[:10]}",
                )
                error.scores = arr
                raise error
            checked[key] = arr
        subs = {k: checked[f"sub_scores[{k!r}]"] for k in out.sub_scores}
        return RewardOutput(scores=checked["scores"], sub_scores=subs)
