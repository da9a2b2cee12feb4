"""Evaluation tables: the per-reward summary of scored samples, paired gains over a baseline, flat metrics.

GenEval's overall score is the mean of its per-tag accuracies (Ghosh et al. 2023); every mean comes with a 95%
bootstrap interval over prompts (:mod:`vgrpo.evaluation.stats`), within tags for GenEval, so a difference inside the
noise
reads as one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vgrpo.evaluation.stats import bootstrap_ci
from vgrpo.rewards.base import Metadata
from vgrpo.rewards.clauses import GENEVAL_TAGS
from vgrpo.rewards.multi import MultiReward, MultiRewardOutput

__all__ = ["compare", "flat_metrics", "summarise"]


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
    (:meth:`vgrpo.rewards.base.Reward.applies_to`) with ``mean_ci``, its 95% bootstrap interval over prompts
    (:mod:`vgrpo.evaluation.stats`), the mean of each sub-score, the image count and ``varied_group_frac`` (prompts
    whose
    samples do not all score the same: GRPO learns nothing from the others). For a GenEval reward also the
    per-tag table of ``strict`` and ``partial`` (each with its interval) and the overall scores, GenEval's mean of
    the per-tag accuracies, with intervals from a bootstrap over prompts within tags.

    ``per_prompt`` holds what paired comparisons (:func:`compare`) and image grids need: each prompt, its tag,
    each reward's per-prompt mean score and sub-scores (None where the reward does not apply), and ``credited``,
    per image whether the verifiable reward credits it (GenEval strict, OCR exact read; None for prompts that
    only learned rewards score).
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
        mask = np.array([term.reward.applies_to(p, md) for p, md in zip(prompts, metadata, strict=True)])
        prompt_mask = np.asarray(mask.reshape(-1, group_size).all(axis=1), dtype=bool)
        raw = scored.raw[key]
        subs = {k.split("/", 1)[1]: v for k, v in scored.sub_scores.items() if k.startswith(f"{key}/")}
        by_prompt = {name: v.reshape(-1, group_size).mean(1) for name, v in {"mean": raw, **subs}.items()}
        entry: dict[str, Any] = {"mean": _mean(raw[mask]), "mean_ci": _ci(by_prompt["mean"][prompt_mask])}
        entry["images"] = int(mask.sum())
        entry.update({sub: _mean(v[mask]) for sub, v in subs.items() if sub not in ("strict", "partial")})
        groups = raw.reshape(-1, group_size)[prompt_mask]
        entry["varied_group_frac"] = _mean((groups.max(1) > groups.min(1)).astype(float))
        per_prompt[key] = {
            name: [float(x) if ok else None for x, ok in zip(v, prompt_mask, strict=True)]
            for name, v in by_prompt.items()
        }
        verdict = subs.get("strict", subs.get("exact"))
        if verdict is not None:
            for i in np.flatnonzero(mask):
                credited[i // group_size][i % group_size] = bool(verdict[i] == 1.0)
        if {"strict", "partial"} <= set(subs):
            ix_tags = np.array(tags)
            per_tag = {}
            for tag in GENEVAL_TAGS:
                rows = prompt_mask & (ix_tags == tag)
                if rows.any():
                    per_tag[tag] = {
                        "strict": float(by_prompt["strict"][rows].mean()),
                        "strict_ci": _ci(by_prompt["strict"][rows]),
                        "partial": float(by_prompt["partial"][rows].mean()),
                        "images": int(rows.sum() * group_size),
                    }
            entry["per_tag"] = per_tag
            if per_tag:
                strata = ix_tags[prompt_mask]
                entry["geneval_strict"] = float(np.mean([v["strict"] for v in per_tag.values()]))
                entry["geneval_strict_ci"] = _ci(by_prompt["strict"][prompt_mask], strata)
                entry["geneval_partial"] = float(np.mean([v["partial"] for v in per_tag.values()]))
                entry["geneval_partial_ci"] = _ci(by_prompt["partial"][prompt_mask], strata)
        table["rewards"][key] = entry
    per_prompt["credited"] = credited
    table["per_prompt"] = per_prompt
    return table


def _paired_differences(a: Sequence[float | None], b: Sequence[float | None]) -> tuple[np.ndarray, np.ndarray]:
    """Per-prompt ``a - b`` over the prompts both score, and the mask of those prompts."""
    ok = np.array([x is not None and y is not None for x, y in zip(a, b, strict=True)])
    return np.array([x - y for x, y in zip(a, b, strict=True) if x is not None and y is not None]), ok


def compare(table: dict[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    """Add to ``table`` its gains over ``baseline``, an evaluation of the same prompts with the same sampling
    settings, each with a 95% paired bootstrap interval over prompts (:mod:`vgrpo.evaluation.stats`): ``gain`` and
    ``gain_ci`` beside each reward's ``mean``, ``geneval_strict_gain`` (``_ci``) and ``geneval_partial_gain``
    beside the overall GenEval scores, and ``strict_gain`` (``_ci``) in each tag's row. Returns ``table``.

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
        d, _ = _paired_differences(mine[key]["mean"], theirs[key]["mean"])
        entry["gain"] = float(d.mean()) if d.size else None
        entry["gain_ci"] = _ci(d)
        if "per_tag" in entry:
            d, ok = _paired_differences(mine[key]["strict"], theirs[key]["strict"])
            entry["geneval_strict_gain"] = entry["geneval_strict"] - baseline["rewards"][key]["geneval_strict"]
            entry["geneval_strict_gain_ci"] = _ci(d, tags[ok])
            entry["geneval_partial_gain"] = entry["geneval_partial"] - baseline["rewards"][key]["geneval_partial"]
            for tag, row in entry["per_tag"].items():
                row["strict_gain"] = float(d[tags[ok] == tag].mean())
                row["strict_gain_ci"] = _ci(d[tags[ok] == tag])
    return table


def flat_metrics(table: Mapping[str, Any]) -> dict[str, float]:
    """The headline numbers of a :func:`summarise` table as flat ``eval/...`` floats (for MLflow, DVC)."""
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
            out[f"eval/{key}_{tag}_strict"] = float(row["strict"])
    return out
