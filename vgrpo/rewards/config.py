"""Config of one reward of a set (``rewards:`` of a stage and of an evaluation), built by name from
:mod:`vgrpo.rewards.registry`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field, model_validator

from vgrpo.config_base import FrozenConfig
from vgrpo.rewards.registry import resolve_reward, reward_key

__all__ = ["RewardConfig", "check_unique_keys"]


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


def check_unique_keys(rewards: Sequence[RewardConfig]) -> None:
    """A ``ValueError`` (a validation error of the config holding them) when two rewards share a key."""
    keys = [r.resolved_key for r in rewards]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise ValueError(f"reward keys {dupes} are used twice; give one of them another `key`")
