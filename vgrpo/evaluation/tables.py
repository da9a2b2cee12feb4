"""Evaluation tables: the per-reward summary of scored samples, paired gains over a baseline, flat metrics.

Every mean comes with a 95% bootstrap interval over prompts (:mod:`vgrpo.evaluation.stats`), so a difference inside
the noise reads as one. What a reward's entry holds beyond its mean is the reward's to say: its class's
:meth:`~vgrpo.rewards.base.Reward.summarise` and :meth:`~vgrpo.rewards.base.Reward.add_gains` (per-tag accuracies,
an overall score stratified by tag), so this module knows no reward.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vgrpo.evaluation.stats import bootstrap_ci
from vgrpo.rewards.base import Metadata, PairedScores, PromptScores, Reward
from vgrpo.rewards.config import RewardConfig
from vgrpo.rewards.multi import MultiReward, MultiRewardOutput

__all__ = ["compare", "flat_metrics", "headline_metrics", "summarise"]


def _mean(values: np.ndarray) -> float | None:
    """Mean, or None (JSON null) for no values: a reward that applies to no prompt has no score."""
    return float(values.mean()) if values.size else None


def _ci(values: np.ndarray, strata: Sequence[str] | np.ndarray | None = None) -> list[float] | None:
    """95% bootstrap interval over prompts (:func:`vgrpo.evaluation.stats.bootstrap_ci`), or None for no values."""
    return list(bootstrap_ci(values, strata)) if values.size else None


def summarise(
    scored: MultiRewardOutput,
    prompts: Sequence[str],
    metadata: Sequence[Metadata],
    rewards: MultiReward,
    *,
    group_size: int,
) -> dict[str, Any]:
    """The evaluation table from the scores of ``N = len(prompts)`` images laid out prompt-major
    (``group_size`` consecutive samples per prompt).

    Per reward key: ``mean`` of the raw score over the images the reward applies to
    (:meth:`vgrpo.rewards.multi.RewardTerm.applies_to`: the reward's own rule and its prompt tags) with ``mean_ci``,
    its 95% bootstrap interval over prompts (:mod:`vgrpo.evaluation.stats`), the mean of each sub-score (but those
    the reward summarises itself), the image count and ``varied_group_frac`` (prompts whose samples do not all score
    the same: GRPO learns nothing from the others); then what the reward's class adds
    (:meth:`vgrpo.rewards.base.Reward.summarise`).

    ``per_prompt`` holds what paired comparisons (:func:`compare`) and image grids need: each prompt, its tag,
    each reward's per-prompt mean score and sub-scores (None where the reward does not apply), and ``credited``,
    per image whether a verifiable reward credits it (its class's :attr:`~vgrpo.rewards.base.Reward.credit_sub_scores`;
    None for prompts that only learned rewards score).
    """
    n = len(prompts)
    if n % group_size:
        raise ValueError(f"{n} samples are not whole groups of {group_size}")
    n_prompts = n // group_size
    table: dict[str, Any] = {"samples": n, "prompts": n_prompts, "group_size": group_size, "rewards": {}}
    tags = [str(md.get("tag")) for md in metadata[::group_size]]
    per_prompt: dict[str, Any] = {"prompt": list(prompts[::group_size]), "tag": tags}
    credited: list[list[bool | None]] = [[None] * group_size for _ in range(n_prompts)]
    for key, term in rewards.terms.items():
        cls = type(term.reward)
        mask = np.array([term.applies_to(p, md) for p, md in zip(prompts, metadata, strict=True)])
        prompt_mask = np.asarray(mask.reshape(-1, group_size).all(axis=1), dtype=bool)
        raw = scored.raw[key]
        subs = {k.split("/", 1)[1]: v for k, v in scored.sub_scores.items() if k.startswith(f"{key}/")}
        by_prompt = {name: v.reshape(-1, group_size).mean(1) for name, v in {"mean": raw, **subs}.items()}
        entry: dict[str, Any] = {"mean": _mean(raw[mask]), "mean_ci": _ci(by_prompt["mean"][prompt_mask])}
        entry["images"] = int(mask.sum())
        entry.update({sub: _mean(v[mask]) for sub, v in subs.items() if sub not in cls.summarised_sub_scores})
        groups = raw.reshape(-1, group_size)[prompt_mask]
        entry["varied_group_frac"] = _mean((groups.max(1) > groups.min(1)).astype(float))
        per_prompt[key] = {
            name: [float(x) if ok else None for x, ok in zip(v, prompt_mask, strict=True)]
            for name, v in by_prompt.items()
        }
        verdict = next((subs[name] for name in cls.credit_sub_scores if name in subs), None)
        if verdict is not None:
            for i in np.flatnonzero(mask):
                credited[i // group_size][i % group_size] = bool(verdict[i] == 1.0)
        entry.update(cls.summarise(PromptScores(by_prompt, prompt_mask, np.array(tags), group_size, _ci)))
        table["rewards"][key] = entry
    per_prompt["credited"] = credited
    table["per_prompt"] = per_prompt
    return table


def compare(table: dict[str, Any], baseline: Mapping[str, Any], rewards: Mapping[str, type[Reward]]) -> dict[str, Any]:
    """Add to ``table`` its gains over ``baseline``, an evaluation of the same prompts with the same sampling
    settings, each with a 95% paired bootstrap interval over prompts (:mod:`vgrpo.evaluation.stats`): ``gain`` and
    ``gain_ci`` beside each reward's ``mean``, then the gains the reward's class adds
    (:meth:`vgrpo.rewards.base.Reward.add_gains`; ``rewards``: key -> class, as
    :func:`vgrpo.rewards.config.reward_classes` gives them; a key it lacks gets the defaults). Returns ``table``.

    Raises:
        ValueError: when the two evaluations differ in prompts, group size or sampling settings.
    """
    mine, theirs = table["per_prompt"], baseline.get("per_prompt")
    if theirs is None:
        raise ValueError("the baseline evaluation has no per-prompt scores (written before they were recorded)")
    for field in ("prompt", "tag"):
        if mine[field] != theirs[field]:
            raise ValueError(f"the baseline evaluation has other prompts ({field} lists differ): no paired gains")
    for field in ("group_size", "sampling"):
        if table.get(field) != baseline.get(field):
            raise ValueError(
                f"the baseline evaluation has another {field}: {baseline.get(field)}, not {table.get(field)}"
            )
    tags = np.array(mine["tag"])
    for key, entry in table["rewards"].items():
        if key not in theirs or key not in baseline["rewards"]:
            continue
        paired = PairedScores(mine[key], theirs[key], tags, _ci)
        d, _ = paired.difference("mean")
        entry["gain"] = float(d.mean()) if d.size else None
        entry["gain_ci"] = _ci(d)
        rewards.get(key, Reward).add_gains(entry, baseline["rewards"][key], paired)
    return table


def flat_metrics(table: Mapping[str, Any]) -> dict[str, float]:
    """The headline numbers of a :func:`summarise` table as flat ``eval/...`` floats (for MLflow, DVC): each
    reward's numbers and intervals, and of a breakdown by prompt tag (``per_tag``) each row's numbers that come with
    an interval, the gains over a baseline aside (``eval/KEY_TAG_NAME``)."""
    out: dict[str, float] = {}
    for key, entry in table["rewards"].items():
        for name, value in entry.items():
            flat = f"eval/{key}_{name}" if name != "mean" else f"eval/{key}"
            if isinstance(value, int | float) and name != "images":
                out[flat] = float(value)
            elif name.endswith("_ci") and isinstance(value, list):  # mean_ci -> eval/KEY_ci_low, eval/KEY_ci_high
                stem = f"eval/{key}_ci" if name == "mean_ci" else f"eval/{key}_{name}"
                out[f"{stem}_low"], out[f"{stem}_high"] = float(value[0]), float(value[1])
        for tag, row in entry.get("per_tag", {}).items():
            for name, value in row.items():
                if f"{name}_ci" in row and not name.endswith("_gain"):
                    out[f"eval/{key}_{tag}_{name}"] = float(value)
    return out


def headline_metrics(flat_eval: Mapping[str, Any], rewards: Sequence[RewardConfig]) -> dict[str, float]:
    """The headline numbers of a flat ``eval/...`` mapping under their short names (what ``dvc metrics show``
    prints): each reward's :meth:`~vgrpo.rewards.base.Reward.headline_columns`, rounded to 5 digits; when two
    rewards name the same short name, the first one present wins."""
    out: dict[str, float] = {}
    for reward in rewards:
        for column in reward.headline_columns():
            if column.name not in out and column.metric in flat_eval:
                out[column.name] = round(float(flat_eval[column.metric]), 5)
    return out
