"""Several rewards as one: per-reward weights and normalisation, every sub-score kept, scoring in the background.

A stage of the curriculum trains on a weighted set of rewards (V-GRPO, Tang et al. 2026: SD3.5-M stages 1 and 3,
HPSv2.1 + PickScore + CLIPScore, App. A.2; FLUX, HPSv2.1, PickScore, ImageReward and UnifiedReward, App. A.1).
:class:`MultiReward` scores a batch with each of them and returns, per reward, the score normalised as
``(score - offset) / scale`` -- MixGRPO (Li et al. 2025) brings PickScore to the scale of the others this way
before its per-reward advantages are summed -- which :func:`vgrpo.advantages.compute_advantages` then
normalises per group (GRPO's advantage, Tang et al. 2026, Sec. 3) and sums with :attr:`MultiReward.weights`.
Raw scores and every sub-score come back for logging.

Each reward scores the prompts it applies to (:meth:`vgrpo.rewards.base.Reward.applies_to`), narrowed by its term's
prompt tags when given (:attr:`RewardTerm.prompt_tags`): a stage on a mixed prompt set can score its OCR prompts by OCR
alone and the others by preference models alone. The rest get NaN, which adds nothing to their advantages.

A reward that fails while scoring -- it raises, or returns something that is not one number per image -- stops the
call with :class:`vgrpo.rewards.base.RewardFailed`, one line naming its key, its import name and what it returned or
raised (and where); a NaN or Inf score stays a :class:`vgrpo.rewards.base.NonFiniteRewardError` (under the key), which
a training stage skips.

Throughput: :meth:`MultiReward.submit` scores on a background thread, so a rollout can decode and score chunk
``k`` while it samples chunk ``k + 1`` (PP-OCR's ONNX runtime and torch release the GIL while they compute).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from vgrpo.errors import ConfigError
from vgrpo.rewards.base import (
    Metadata,
    NonFiniteRewardError,
    Reward,
    RewardFailed,
    TransientRewardError,
    TransientRewardFailed,
    check_images,
    describe_raised,
)
from vgrpo.rewards.config import RewardConfig, check_unique_keys
from vgrpo.rewards.registry import FunctionReward, build_reward, refuse_reward_class
from vgrpo.rewards.video import PerFrameMean, check_videos

__all__ = ["MultiReward", "MultiRewardOutput", "RewardTerm", "import_name"]


def import_name(reward: Reward) -> str:
    """``module:qualname`` of a reward's class, or of a reward function's function."""
    target = reward.fn if isinstance(reward, FunctionReward) else type(reward)
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', type(target).__name__)}"


def _nanmean(values: np.ndarray) -> float:
    """Mean over the finite entries (NaN marks images a reward does not apply to); NaN when there are none."""
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else float("nan")


@dataclass(frozen=True)
class RewardTerm:
    """One reward of a set: the reward, its weight in the advantage sum, its affine normalisation, and the prompt
    tags it scores (``None``: every prompt the reward applies to)."""

    reward: Reward
    weight: float = 1.0
    offset: float = 0.0
    scale: float = 1.0
    prompt_tags: frozenset[str] | None = None

    def __post_init__(self) -> None:
        refuse_reward_class(self.reward, "RewardTerm.reward")
        if not isinstance(self.reward, Reward):  # a function is wrapped first, as Trainer(rewards=...) does
            raise ConfigError(
                f"RewardTerm.reward: a Reward instance, got {type(self.reward).__name__} (a reward function: "
                "FunctionReward(fn, key))"
            )
        if self.scale <= 0:
            raise ValueError(f"reward {self.reward.name!r}: scale must be > 0, got {self.scale}")

    def applies_to(self, prompt: str, metadata: Metadata | None) -> bool:
        """Whether this term scores ``prompt``: its reward applies to it (:meth:`Reward.applies_to`) and, with
        :attr:`prompt_tags`, its row's ``tag`` is one of them."""
        if self.prompt_tags is not None and (metadata is None or metadata.get("tag") not in self.prompt_tags):
            return False
        return self.reward.applies_to(prompt, metadata)


@dataclass(frozen=True)
class MultiRewardOutput:
    """Scores of ``N`` images under every reward of a :class:`MultiReward`.

    Attributes:
        scores: key -> ``(N,)`` normalised scores, what advantages are computed from.
        raw: key -> ``(N,)`` scores as the reward returned them (what evaluation tables report).
        sub_scores: ``"key/sub"`` -> ``(N,)``.
        seconds: key -> wall seconds the reward took on this batch.
    """

    scores: dict[str, np.ndarray]
    raw: dict[str, np.ndarray]
    sub_scores: dict[str, np.ndarray] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def score_tensors(self) -> dict[str, Any]:
        """:attr:`scores` as float32 torch tensors, what :func:`vgrpo.advantages.compute_advantages` takes."""
        return {key: torch.as_tensor(values, dtype=torch.float32) for key, values in self.scores.items()}

    def metrics(self, prefix: str = "reward/") -> dict[str, float]:
        """Flat means for logging: raw score, normalised score, every sub-score and the time of each reward."""
        out: dict[str, float] = {}
        for key, raw in self.raw.items():
            out[f"{prefix}{key}_raw_mean"] = _nanmean(raw)
            out[f"{prefix}{key}_mean"] = _nanmean(self.scores[key])
        for key, sub in self.sub_scores.items():
            out[f"{prefix}{key}_mean"] = _nanmean(sub)
        for key, sec in self.seconds.items():
            out[f"time/reward_{key}_s"] = sec
        return out

    @staticmethod
    def concatenate(parts: Sequence[MultiRewardOutput]) -> MultiRewardOutput:
        """Chunks scored separately, joined in order (times added)."""
        if not parts:
            raise ValueError("nothing to concatenate")

        def cat(name: str) -> dict[str, np.ndarray]:
            # A chunk where a reward applied to no image has none of its sub-scores: NaN there.
            keys = dict.fromkeys(k for p in parts for k in getattr(p, name))
            return {
                k: np.concatenate(
                    [getattr(p, name).get(k, np.full(len(next(iter(p.raw.values()))), np.nan)) for p in parts]
                )
                for k in keys
            }

        seconds = {k: float(sum(p.seconds.get(k, 0.0) for p in parts)) for k in parts[0].seconds}
        return MultiRewardOutput(scores=cat("scores"), raw=cat("raw"), sub_scores=cat("sub_scores"), seconds=seconds)


class MultiReward:
    """A weighted set of rewards under names (``keys``) of the caller's choosing.

    Args:
        terms: key -> :class:`RewardTerm`. Keys name the rewards in logs and in ``advantage.weights``.
        sources: key -> the name the reward was built from (a registry name, ``module:function``), which a
            :class:`vgrpo.rewards.base.RewardFailed` quotes; default: the ``module:qualname`` of its class or function.
    """

    def __init__(self, terms: Mapping[str, RewardTerm], sources: Mapping[str, str] | None = None):
        if not terms:
            raise ValueError("a reward set needs at least one reward")
        for key, term in terms.items():
            if not isinstance(term, RewardTerm):  # a Reward (or its class) given where its term goes
                refuse_reward_class(term, f"terms[{key!r}]")
                raise ConfigError(f"terms[{key!r}]: a RewardTerm, got {type(term).__name__}: RewardTerm(reward)")
        self.terms = dict(terms)
        self.sources = {key: (sources or {}).get(key) or import_name(term.reward) for key, term in self.terms.items()}
        self._executor: ThreadPoolExecutor | None = None

    @classmethod
    def from_configs(cls, configs: Sequence[RewardConfig]) -> MultiReward:
        """Built from a stage's or an evaluation's ``rewards`` (registry names, their keys unique)."""
        check_unique_keys(configs)
        terms = {
            c.resolved_key: RewardTerm(
                reward=build_reward(c.name, c.options),
                weight=c.weight,
                offset=c.offset,
                scale=c.scale,
                prompt_tags=None if c.prompt_tags is None else frozenset(c.prompt_tags),
            )
            for c in configs
        }
        return cls(terms, {c.resolved_key: c.name for c in configs})

    @property
    def weights(self) -> dict[str, float]:
        """key -> weight, as :func:`vgrpo.advantages.compute_advantages` takes them."""
        return {key: term.weight for key, term in self.terms.items()}

    @property
    def needs_metadata(self) -> bool:
        """Whether the callers pass the prompt rows: some reward reads them (:attr:`Reward.reads_metadata`), or
        some term scores by their tags (:attr:`RewardTerm.prompt_tags`)."""
        return any(term.reward.reads_metadata or term.prompt_tags is not None for term in self.terms.values())

    def __call__(
        self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None = None
    ) -> MultiRewardOutput:
        """Every reward on the images it applies to (:meth:`RewardTerm.applies_to`: the reward's own
        :meth:`vgrpo.rewards.base.Reward.applies_to` and the term's prompt tags); the others get NaN, which training
        rejects by the reward's name and evaluation leaves out of its means.

        A video family's samples, uint8 frames ``(N, T, H, W, 3)``, are scored per frame and averaged per video
        (:class:`vgrpo.rewards.video.PerFrameMean`, each reward called once on all ``N * T`` frames).

        Raises:
            ValueError: for bad input (not ``uint8 (N, H, W, 3)`` images or ``(N, T, H, W, 3)`` videos, ``N``
                prompts and metadata rows; no metadata for a term that scores by prompt tags).
            RewardFailed: a reward raised, or returned something that is not ``N`` numbers (one line naming its key,
                its import name and what it returned or raised; the reward's own exception chained).
                :class:`vgrpo.rewards.base.TransientRewardFailed` when its engine could not be reached.
            NonFiniteRewardError: a reward returned NaN or Inf scores (``quantity``: ``reward/KEY``).
        """
        images = check_videos(images) if np.ndim(images) == 5 else check_images(images)
        n = len(prompts)
        if len(images) != n or (metadata is not None and len(metadata) != n):
            counts = f"{len(images)} images, {n} prompts" + ("" if metadata is None else f", {len(metadata)} rows")
            raise ValueError(f"rewards {sorted(self.terms)}: {counts}")
        scores, raw, subs, seconds = {}, {}, {}, {}
        for key, term in self.terms.items():
            t0 = time.perf_counter()
            if term.prompt_tags is not None and metadata is None:
                raise ValueError(f"reward {key!r} scores prompts by their tags: it needs the prompt rows (metadata)")
            values, sub_values = self._score(key, term, images, prompts, metadata)
            seconds[key] = time.perf_counter() - t0
            raw[key] = values
            scores[key] = (values - term.offset) / term.scale
            subs.update({f"{key}/{sub}": v for sub, v in sub_values.items()})
        return MultiRewardOutput(scores=scores, raw=raw, sub_scores=subs, seconds=seconds)

    def _score(
        self,
        key: str,
        term: RewardTerm,
        images: np.ndarray,
        prompts: Sequence[str],
        metadata: Sequence[Metadata] | None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """One reward's raw scores and sub-scores (NaN where it does not apply); its failures named by ``key``."""
        try:
            return self._apply(term, images, prompts, metadata)
        except NonFiniteRewardError as exc:
            if exc.quantity == f"reward/{key}":
                raise
            keyed = NonFiniteRewardError(
                f"reward/{key}",
                exc.details,
                message=f"reward {key!r} returned non-finite scores at images {exc.details.get('indices', [])[:10]}",
            )
            keyed.scores = exc.scores
            raise keyed from exc
        except RewardFailed as exc:  # a bad return, named by the reward's name: name it by its key
            raise exc.renamed(key, self.sources[key]) from (exc.__cause__ or exc)
        except TransientRewardError as exc:  # still retried (TransientRewardError), one line when not
            raise TransientRewardFailed(key, describe_raised(exc), self.sources[key]) from exc
        except Exception as exc:  # the reward's own bug or its engine's failure
            raise RewardFailed(key, describe_raised(exc), self.sources[key]) from exc

    @staticmethod
    def _apply(
        term: RewardTerm, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        n, reward = len(prompts), term.reward
        mask = np.array(
            [term.applies_to(p, None if metadata is None else metadata[i]) for i, p in enumerate(prompts)],
            dtype=bool,
        )
        values = np.full(n, np.nan)
        sub_values: dict[str, np.ndarray] = {}
        score = reward if images.ndim == 4 else PerFrameMean(reward)  # videos: each frame, averaged per video
        if mask.all():
            out = score(images, prompts, metadata)
            values, sub_values = out.scores, out.sub_scores
        elif mask.any():
            idx = [int(i) for i in np.flatnonzero(mask)]
            out = score(
                images[idx], [prompts[i] for i in idx], None if metadata is None else [metadata[i] for i in idx]
            )
            values[idx] = out.scores
            for sub, v in out.sub_scores.items():
                sub_values[sub] = np.full(n, np.nan)
                sub_values[sub][idx] = v
        return values, sub_values

    def submit(
        self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None = None
    ) -> Future[MultiRewardOutput]:
        """Score on the background thread; ``images`` must not be modified until the future is done."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rewards")
        return self._executor.submit(self, images, list(prompts), None if metadata is None else list(metadata))

    def close(self) -> None:
        """Stop the background thread (waits for work already submitted)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def __enter__(self) -> MultiReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
