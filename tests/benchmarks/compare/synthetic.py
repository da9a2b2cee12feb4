"""Synthetic cell records for the benchmark report's tests: the whole plan of the grid, with curves whose effects
are known, in the records' real format (configs from the plan itself, so the provenance checks pass)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import GENEVAL_TAGS, METHODS
from benchmarks.compare import plan

TAGS = [t for t in GENEVAL_TAGS for _ in range(4)]  # 24 prompts
PREF_TAGS = [t for t in (*GENEVAL_TAGS, "ocr") for _ in range(4)]
BASE = 0.4
# Each method's gain over the base at the end of its 80 iterations; curves rise as 1 - exp(-it / tau).
GAIN = {"vgrpo": 0.20, "naive_elbo": 0.12, "flow_grpo": 0.10, "mixgrpo": 0.08, "diffusion_nft": 0.21}
TAU = {"vgrpo": 15.0, "naive_elbo": 25.0, "flow_grpo": 40.0, "mixgrpo": 40.0, "diffusion_nft": 20.0}
ABLATION = {"n_mc_2": (0.10, 40.0), "n_mc_8": (0.205, 15.0), "v_prediction": (0.16, 25.0), "eps_prediction": None}


def _curve(gain: float, tau: float, its: list[int], tags: list[str], rng: np.random.Generator, noise: float) -> list:
    base = _base_scores(tags)
    points = []
    for it in its:
        level = gain * (1 - np.exp(-it / tau))
        per_prompt = base + level + rng.normal(0, noise, len(tags))
        points.append(
            {
                "iteration": float(it),
                "train_s": 3.0 * it,
                "gradient_steps": 2.0 * it,
                "nfe": 1000.0 * it,
                "score": float(per_prompt.mean()),
                "partial": float(per_prompt.mean()),
                "clipscore": 1.5,
                "per_prompt": [float(x) for x in per_prompt],
            }
        )
    return points


def _base_scores(tags: list[str]) -> np.ndarray:
    return BASE + 0.2 * np.sin(np.arange(len(tags)))  # prompts of different difficulty


def _record(spec: plan.RunSpec, sizes: plan.Sizes, curve: list, *, diverged: str | None = None, cv: float = 0.3):
    config = plan.stage_config(spec, sizes, Path("/bench/prompts.jsonl")).model_dump(mode="json")
    n = len(curve)
    return {
        "spec": dataclasses.asdict(spec),
        "name": spec.name,
        "curve": curve,
        "wall_s": 60.0,
        "diverged": diverged,
        "skipped_iterations": 0,
        "samples_per_iteration": 64,
        "gradient_steps_per_iteration": 2.0,
        "time_split_s": {"iteration": 3.0, "rollout": 1.5, "reward": 0.1, "prepare": 0.4, "update": 1.0},
        "surrogate_cv": cv,
        "surrogate_cv_within_group": cv / 2,
        "surrogate_cv_per_iteration": [cv * (1 + 0.1 * np.sin(i)) for i in range(10 * n)],
        "surrogate_cv_within_group_per_iteration": [cv / 2 * (1 + 0.1 * np.cos(i)) for i in range(10 * n)],
        "grad_norm_per_iteration": [0.05] * 10 * n,
        "surrogate_mean_per_iteration": [-0.15] * 10 * n,
        "train_reward": [0.5] * 10 * n,
        "peak_rss_mb": 1000.0,
        "config": config,
        "key": "k",
        "code_hash": "c",
        "git": {"commit": "0" * 40, "code_dirty": False},
        "threads": 2,
        "machine": {"other_load_cores": 0.01, "under_load": False, "process_cpu_s": 100.0, "wall_s": 60.0},
    }


def base_record(reward: str, split: str) -> dict[str, Any]:
    tags = PREF_TAGS if reward == "preference" else TAGS
    spec = plan.RunSpec("base", "base", reward, split=split)
    scores = _base_scores(tags)
    point = {"iteration": 0.0, "train_s": 0.0, "gradient_steps": 0.0, "nfe": 0.0, "score": float(scores.mean())}
    point |= {"per_prompt": [float(x) for x in scores], "tags": tags, "clipscore": 1.4, "partial": 0.5}
    return {"spec": dataclasses.asdict(spec), "name": spec.name, "curve": [point], "wall_s": 5.0}


def cell_record(spec: plan.RunSpec, sizes: plan.Sizes, rng: np.random.Generator, noise: float) -> dict[str, Any]:
    """A trained cell's record with its phase's known effect: each method rises to its :data:`GAIN`; the
    ablations as :data:`ABLATION`; at raised rates naive loses 0.2 GenEval strict (2.0 PickScore) and V-GRPO holds;
    at its own rate (v3's own-rate phase) naive dips 0.06 (0.6) and V-GRPO holds; the preference stage raises both."""
    its = list(range(spec.eval_every, spec.iterations + 1, spec.eval_every))
    tags = PREF_TAGS if spec.reward == "preference" else TAGS
    if spec.phase == "ablation":
        effect = ABLATION[spec.variant]
        if effect is None:  # eps-prediction falls 0.15 below the base and stays there
            curve = _curve(-0.15, 5.0, its, tags, rng, noise)
        else:
            curve = _curve(effect[0], effect[1], its, tags, rng, noise)
    elif spec.phase in ("stability", "own_rate"):
        fall = {"stability": 0.2, "own_rate": 0.06}[spec.phase] * (10.0 if spec.reward == "preference" else 1.0)
        curve = _curve(0.05 if spec.method == "vgrpo" else -fall, 10.0, its, tags, rng, noise)
    elif spec.phase == "preference":
        curve = _curve(0.5 if spec.method == "vgrpo" else 0.3, 10.0, its, tags, rng, noise)
    else:
        curve = _curve(GAIN[spec.method], TAU[spec.method], its, tags, rng, noise)
    return _record(spec, sizes, curve, cv=0.3 if spec.method == "vgrpo" else 0.9)


def full_grid(sizes: plan.Sizes | None = None, noise: float = 0.02) -> dict[str, dict[str, Any]]:
    """Records for every cell of the full plan (a sweep whose best rung is interior for every method)."""
    sizes = sizes or plan.Sizes()
    records = {r["name"]: r for r in (base_record("geneval", "test"), base_record("geneval", "val"))}
    records["base-preference-test"] = base_record("preference", "test")
    rng = np.random.default_rng(0)
    best = {m: 2e-4 for m in METHODS} | {"flow_grpo": 4e-4}
    for spec in plan.plan_phase("sweep", sizes, best, False):
        peak = np.log2(spec.lr / best[spec.method])
        gain = GAIN[spec.method] * (1 - 0.3 * peak**2)
        its = list(range(spec.eval_every, spec.iterations + 1, spec.eval_every))
        records[spec.name] = _record(spec, sizes, _curve(gain, TAU[spec.method], its, TAGS, rng, noise))
    for phase in plan.PHASES[2:]:
        for spec in plan.plan_phase(phase, sizes, best, False):
            records[spec.name] = cell_record(spec, sizes, rng, noise)
    return records


def v3_grid(tuned: dict[str, Any], noise: float = 0.02) -> dict[str, dict[str, Any]]:
    """Records for every cell of benchmark v3's plan (:func:`benchmarks.compare.plan_v3.full_plan`) at ``tuned``."""
    from benchmarks.compare import plan_v3

    records = {r["name"]: r for r in (base_record("geneval", "test"), base_record("preference", "test"))}
    rng = np.random.default_rng(1)
    for spec in plan_v3.full_plan(tuned):
        if spec.phase != "base":
            records[spec.name] = cell_record(spec, plan_v3.V3, rng, noise)
    return records


def v4_grid(tuned: dict[str, Any], design: Any, noise: float = 0.02) -> dict[str, dict[str, Any]]:
    """Records for every cell of a benchmark v4 plan (:func:`benchmarks.compare.grid.full_plan` on ``design``) at
    ``tuned``; the replicate group has its methods group's effect."""
    from benchmarks.compare import grid

    records = {r["name"]: r for r in (base_record("geneval", "test"), base_record("preference", "test"))}
    rng = np.random.default_rng(2)
    for spec in grid.full_plan(tuned, design):
        if spec.phase != "base":
            records[spec.name] = cell_record(spec, design.sizes, rng, noise)
    return records
