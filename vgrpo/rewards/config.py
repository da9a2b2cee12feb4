"""Config of one reward of a set (``rewards:`` of a stage and of an evaluation), built by name from
:mod:`vgrpo.rewards.registry`; and what its class answers from it before anything is built (prompt checks,
headline columns, the classes an evaluation table asks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from vgrpo.config_base import FrozenConfig
from vgrpo.rewards.base import HeadlineColumn, Metadata, Reward
from vgrpo.rewards.registry import resolve_reward, reward_class, reward_key

__all__ = ["RewardConfig", "check_unique_keys", "prompt_problems", "reward_classes"]


class RewardConfig(FrozenConfig):
    """One reward of a set (:class:`vgrpo.rewards.multi.RewardTerm`), built by name from the registry."""

    name: str = Field(
        description="Registry name (vgrpo.rewards.registry.REWARDS: geneval, ocr, pickscore, ...), an entry point of "
        "the `vgrpo.rewards` group, or `module:Class` (a Reward subclass) / `module:function` (a reward function)."
    )
    key: str | None = Field(None, description="Name in logs and tables; default `name`. Needed to use one twice.")
    weight: float = Field(1.0, description="w_m in A = sum_m w_m A^m (vgrpo.advantages.compute_advantages).")
    offset: float = Field(0.0, description="Normalised score (s - offset) / scale; MixGRPO's PickScore: 18.")
    scale: float = Field(1.0, gt=0, description="MixGRPO's PickScore: 8; flow_grpo's PickScore: 26.")
    options: dict[str, Any] = Field(default_factory=dict, description="Keyword options of the reward's class.")

    @model_validator(mode="after")
    def _check_name(self) -> RewardConfig:
        try:
            resolve_reward(self.name)  # imports a user's reward now, so a typo fails before any compute
        except (KeyError, TypeError) as exc:
            raise ValueError(exc.args[0] if exc.args else str(exc)) from exc  # str(KeyError) adds quotes
        return self

    @property
    def resolved_key(self) -> str:
        return reward_key(self.name, self.key)

    @property
    def reward_class(self) -> type[Reward]:
        """The class that answers for this reward before it is built (:func:`vgrpo.rewards.registry.reward_class`)."""
        return reward_class(self.name)

    def check_prompts(self, rows: Sequence[Metadata], path: str | Path) -> list[str]:
        """What is wrong with prompt rows ``rows`` of ``path`` for this reward (:meth:`Reward.check_prompts`)."""
        return self.reward_class.check_prompts(rows, path, self.options)

    def headline_columns(self) -> tuple[HeadlineColumn, ...]:
        """This reward's headline numbers in an evaluation (:meth:`Reward.headline_columns`)."""
        return self.reward_class.headline_columns(self.resolved_key, self.options)


def check_unique_keys(rewards: Sequence[RewardConfig]) -> None:
    """A ``ValueError`` (a validation error of the config holding them) when two rewards share a key."""
    keys = [r.resolved_key for r in rewards]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise ValueError(f"reward keys {dupes} are used twice; give one of them another `key`")


def prompt_problems(rewards: Sequence[RewardConfig], rows: Sequence[Metadata], path: str | Path) -> list[str]:
    """Every problem the rewards find with prompt rows ``rows`` of ``path`` (:meth:`Reward.check_prompts`), each
    once, in the rewards' order."""
    return list(dict.fromkeys(problem for reward in rewards for problem in reward.check_prompts(rows, path)))


def reward_classes(rewards: Sequence[RewardConfig]) -> Mapping[str, type[Reward]]:
    """Reward key -> the class that answers for it, what evaluation tables of files ask
    (:func:`vgrpo.evaluation.tables.compare`, :func:`vgrpo.evaluation.report.format_table`)."""
    return {reward.resolved_key: reward.reward_class for reward in rewards}
