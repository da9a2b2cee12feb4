"""Config of one reward of a set (``rewards:`` of a stage and of an evaluation), built by name from
:mod:`vgrpo.rewards.registry`; and what its class answers from it before anything is built (prompt checks,
headline columns, the classes an evaluation table asks)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, model_validator

from vgrpo.config_base import FrozenConfig
from vgrpo.rewards.base import HeadlineColumn, Metadata, Reward
from vgrpo.rewards.registry import resolve_reward, reward_class, reward_key

__all__ = [
    "RewardConfig",
    "check_unique_keys",
    "prompt_problems",
    "reward_classes",
    "tag_problems",
    "unrewarded_tags",
]


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
    prompt_tags: tuple[str, ...] | None = Field(
        None,
        description="Score only prompts with these `tag`s, of those the reward applies to (GenEval: rows with "
        "GenEval clauses; OCR: prompts with a quoted text); None = every prompt it applies to. The others get NaN, "
        "adding nothing to their advantage; every prompt tag a stage draws needs a reward that scores it.",
    )

    LATER_OPTIONS: ClassVar[Mapping[str, Any]] = {"prompt_tags": None}

    @model_validator(mode="after")
    def _check_name(self) -> RewardConfig:
        try:
            resolve_reward(self.name)  # imports a user's reward now, so a typo fails before any compute
        except (KeyError, TypeError) as exc:
            raise ValueError(exc.args[0] if exc.args else str(exc)) from exc  # str(KeyError) adds quotes
        if self.prompt_tags is not None and not self.prompt_tags:
            raise ValueError(f"reward {self.resolved_key!r}: prompt_tags is empty (it would score no prompt)")
        return self

    def scores_tag(self, tag: Any) -> bool:
        """Whether ``prompt_tags`` lets this reward score prompts tagged ``tag`` (``None``: a row without one)."""
        return self.prompt_tags is None or tag in self.prompt_tags

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


def unrewarded_tags(rewards: Sequence[RewardConfig], tags: Iterable[Any]) -> list[Any]:
    """The tags among ``tags`` that every reward's ``prompt_tags`` leaves out, in order: their prompts would be scored
    by no reward, and :func:`vgrpo.advantages.compute_advantages` refuses such a group mid-stage."""
    return [tag for tag in dict.fromkeys(tags) if not any(reward.scores_tag(tag) for reward in rewards)]


def tag_problems(
    rewards: Sequence[RewardConfig], rows: Sequence[Metadata], path: str | Path, kept_tags: Collection[str] | None
) -> list[str]:
    """A problem per tag of prompt rows ``rows`` of ``path`` that every reward's ``prompt_tags`` leaves out (of
    ``kept_tags`` only, when given: the tags a stage's own ``prompt_tags`` keeps), naming the tag and its first row."""
    if all(reward.prompt_tags is None for reward in rewards):
        return []  # every reward scores every tag: nothing to check (nor rows to walk)
    first: dict[Any, int] = {}
    for lineno, row in enumerate(rows, 1):
        first.setdefault(row.get("tag"), lineno)
    drawn = [tag for tag in first if kept_tags is None or tag in kept_tags]
    return [
        f"{path}: {'prompts without a `tag`' if tag is None else f'prompts tagged {tag!r}'} (the first: row "
        f"{first[tag]}) are scored by no reward: every reward's prompt_tags leaves the tag out (name it in one, or "
        "leave it out with the stage's prompt_tags)"
        for tag in unrewarded_tags(rewards, drawn)
    ]


def prompt_problems(
    rewards: Sequence[RewardConfig],
    rows: Sequence[Metadata],
    path: str | Path,
    kept_tags: Collection[str] | None = None,
) -> list[str]:
    """Every problem the rewards find with prompt rows ``rows`` of ``path`` (:meth:`Reward.check_prompts`), each
    once, in the rewards' order; then their ``prompt_tags`` against the rows' tags (:func:`tag_problems`)."""
    found = (problem for reward in rewards for problem in reward.check_prompts(rows, path))
    return list(dict.fromkeys([*found, *tag_problems(rewards, rows, path, kept_tags)]))


def reward_classes(rewards: Sequence[RewardConfig]) -> Mapping[str, type[Reward]]:
    """Reward key -> the class that answers for it, what evaluation tables of files ask
    (:func:`vgrpo.evaluation.tables.compare`, :func:`vgrpo.evaluation.report.format_table`)."""
    return {reward.resolved_key: reward.reward_class for reward in rewards}
