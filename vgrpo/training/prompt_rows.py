"""The prepare-prompts phase of a stage, and each iteration's draw from its rows.

:func:`prepare_prompts` reads the training and evaluation prompt files, each checked by the rewards that read it
(:meth:`vgrpo.rewards.base.Reward.check_prompts`), and applies ``prompt_tags``, ``prompt_tag_weights`` and
``evaluation.max_prompts``; :func:`sample_prompt_rows` draws an iteration's prompts from ``(seed, iteration)``
alone, so a resumed stage draws what an uninterrupted one draws.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vgrpo.config import StageConfig
from vgrpo.prompts import PromptFileError, load_prompts
from vgrpo.rewards.base import Metadata
from vgrpo.rewards.config import RewardConfig, prompt_problems
from vgrpo.seeding import derive_seed
from vgrpo.training.replay import replay_rows

__all__ = ["StagePrompts", "checked_rows", "evaluation_rows", "prepare_prompts", "sample_prompt_rows", "training_rows"]


def sample_prompt_rows(
    rows: Sequence[Metadata],
    count: int,
    seed: int,
    iteration: int,
    tag_weights: Mapping[str, float] | None = None,
) -> list[Metadata]:
    """``count`` prompt rows for one iteration, without replacement when there are enough. With ``tag_weights``
    each row's probability is its tag's weight shared among the tag's rows (every row's tag needs a weight)."""
    rng = np.random.default_rng(derive_seed(seed, iteration, 0))
    p = None
    if tag_weights is not None:
        tags = [str(r.get("tag")) for r in rows]
        per_tag = Counter(tags)
        p = np.array([tag_weights[t] / per_tag[t] for t in tags])
        p = p / p.sum()
    idx = rng.choice(len(rows), size=count, replace=len(rows) < count, p=p)
    return [rows[int(i)] for i in idx]


@dataclass(frozen=True)
class StagePrompts:
    """The stage's prompt rows, validated and filtered: ``train`` to draw from, ``evaluation`` (or ``None``), and
    ``replay``'s rows (:mod:`vgrpo.training.replay`; empty without replay)."""

    train: list[dict[str, Any]]
    evaluation: list[dict[str, Any]] | None
    replay: list[dict[str, Any]] = field(default_factory=list)


def checked_rows(
    path: Path, rewards: Sequence[RewardConfig], kept_tags: Collection[str] | None = None
) -> list[dict[str, Any]]:
    """The rows of prompt file ``path``, checked by every reward in ``rewards`` that reads them
    (:meth:`vgrpo.rewards.base.Reward.check_prompts`: GenEval's clauses and its detector's vocabulary), the
    rewards' ``prompt_tags`` against the tags of the rows a ``prompt_tags`` filter keeps (``kept_tags``).

    Raises:
        PromptFileError: naming the file and what is wrong (one line per problem).
    """
    rows = load_prompts(path)
    problems = prompt_problems(rewards, rows, path, kept_tags)
    if problems:
        raise PromptFileError("\n".join(problems))
    return rows


def training_rows(config: StageConfig, root: Path) -> list[dict[str, Any]]:
    """The rows of the training prompt file (relative to ``root``) checked by the training rewards, with
    ``prompt_tags`` / ``prompt_tag_weights`` applied."""
    rows = checked_rows(root / config.prompts, config.rewards, config.prompt_tags)
    present = sorted({str(r.get("tag")) for r in rows})
    if config.prompt_tags is not None:
        absent = [t for t in config.prompt_tags if t not in present]
        if absent:
            raise ValueError(f"{config.prompts}: prompt_tags {absent} name no prompt's tag (its tags: {present})")
        rows = [r for r in rows if r.get("tag") in config.prompt_tags]
    if config.prompt_tag_weights is not None:
        kept = {str(r.get("tag")) for r in rows}
        unweighted = sorted(kept - set(config.prompt_tag_weights))
        if unweighted:
            raise ValueError(
                f"{config.prompts}: prompt_tag_weights has no weight for the tags {unweighted} "
                "(give them one, or leave them out with prompt_tags)"
            )
        unused = sorted(set(config.prompt_tag_weights) - kept)
        if unused:
            raise ValueError(f"{config.prompts}: prompt_tag_weights names tags no prompt drawn has: {unused}")
    return [dict(r) for r in rows]


def prepare_prompts(config: StageConfig, root: Path) -> StagePrompts:
    """Read the training and evaluation prompt files (relative to ``root``), each checked by the rewards that read
    it (:func:`training_rows`, :func:`evaluation_rows`), and the replay's rows of the training file."""
    replay = [] if config.replay is None else replay_rows(config.replay, root / config.prompts)
    return StagePrompts(train=training_rows(config, root), evaluation=evaluation_rows(config, root), replay=replay)


def evaluation_rows(config: StageConfig, root: Path) -> list[dict[str, Any]] | None:
    """The first ``evaluation.max_prompts`` rows of the evaluation prompt file, the file checked by the evaluation
    rewards; ``None`` without an evaluation prompt file."""
    if not config.eval_prompts:
        return None
    rows = checked_rows(root / config.eval_prompts, config.evaluation.rewards)
    return [dict(r) for r in rows[: config.evaluation.max_prompts]] or None
