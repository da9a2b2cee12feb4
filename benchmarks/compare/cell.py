"""One cell of the comparison grid, trained (or, for the base, evaluated) in this process: its record is the
held-out curve against training wall time, gradient steps and transformer evaluations, the per-prompt scores of
every evaluation point, the per-iteration time split, peak memory, surrogate-CV statistics and the per-iteration
diagnostics of :mod:`benchmarks.compare.series`."""

from __future__ import annotations

import resource
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from diffusers import SD3Transformer2DModel

from benchmarks.common import ROOT
from benchmarks.compare.plan import REWARDS, RunSpec, Sizes, eval_prompt_file, stage_config
from benchmarks.compare.series import NEW_SERIES
from benchmarks.provenance import MachineClock, cell_key, code_hash, git_state
from vgrpo.evaluation.evaluator import Sampling, evaluate
from vgrpo.models.pipeline import build_adapter, load_pipeline
from vgrpo.rewards.config import RewardConfig
from vgrpo.rewards.multi import MultiReward
from vgrpo.training.guards import TrainingDiverged
from vgrpo.training.stage import StageCallbacks, run_stage
from vgrpo.world import read_jsonl


def scores_of(table: dict[str, Any], reward: str) -> dict[str, Any]:
    """What the report needs from an evaluation table: the headline numbers and the per-prompt scores (the
    prompts' tags are in the base cell's record only: every cell of a reward scores the same prompt file)."""
    pp = table["per_prompt"]
    if reward == "geneval":
        g = table["rewards"]["geneval"]
        credited = pp["credited"]
        return {
            "score": float(g["geneval_strict"]),
            "partial": float(g["geneval_partial"]),
            "per_prompt": [sum(map(bool, c)) / len(c) for c in credited],
        }
    pick = table["rewards"]["world_pickscore"]
    return {
        "score": float(pick["mean"]),
        "clipscore": float(table["rewards"]["world_clipscore"]["mean"]),
        "per_prompt": [round(float(v), 5) for v in pp["world_pickscore"]["mean"]],
    }


def expected_key(spec: RunSpec, sizes: Sizes, out: Path, threads: int) -> str:
    """The provenance key (:func:`benchmarks.provenance.cell_key`) a record of ``spec`` must carry to be reused."""
    prompts = eval_prompt_file(out, spec.reward, spec.split, sizes)
    if spec.phase == "base":
        evaluation = {
            "eval_group": sizes.eval_group,
            "eval_steps": sizes.eval_steps,
            "rewards": REWARDS[spec.reward]["eval_rewards"],
        }
        return cell_key({**asdict(spec), **evaluation}, None, threads, [prompts])
    config = stage_config(spec, sizes, prompts).model_dump(mode="json")
    return cell_key(asdict(spec), config, threads, [prompts, ROOT / config["prompts"]])


def run_base(spec: RunSpec, sizes: Sizes, out: Path) -> dict[str, Any]:
    """The base model's evaluation (the start of every curve)."""
    pipe = load_pipeline(ROOT / "models/embedded-base")
    adapter, policy = build_adapter(pipe)
    rows = read_jsonl(eval_prompt_file(out, spec.reward, spec.split, sizes))
    rewards = MultiReward.from_configs([RewardConfig.model_validate(r) for r in REWARDS[spec.reward]["eval_rewards"]])
    t0 = time.perf_counter()
    table, _ = evaluate(
        adapter=adapter,
        policy=policy,
        metadata=rows,
        rewards=rewards,
        group_size=sizes.eval_group,
        sampling=Sampling(sizes.eval_steps, 0, adapter.sigma_shift(None, dynamic=False)),
    )
    point = {
        "iteration": 0.0,
        "train_s": 0.0,
        "gradient_steps": 0.0,
        "nfe": 0.0,
        **scores_of(table, spec.reward),
        "tags": table["per_prompt"]["tag"],
    }
    return {"spec": asdict(spec), "name": spec.name, "curve": [point], "wall_s": time.perf_counter() - t0}


class CurveRecorder(StageCallbacks):
    """The cell's history and held-out curve as the stage reports them: each evaluation point with the training
    seconds, gradient steps and transformer rows (``counted``, less the evaluations' own) spent before it."""

    def __init__(self, reward: str, steps_per_iteration: float, counted: dict[str, int]) -> None:
        self.reward, self.steps_per_iteration, self.counted = reward, steps_per_iteration, counted
        self.history: list[dict[str, float]] = []
        self.curve: list[dict[str, Any]] = []
        self.clock = {"train_s": 0.0, "eval_rows": 0, "rows_at_log": 0, "steps": 0.0}

    def on_log(self, metrics: dict[str, float], iteration: int) -> None:
        self.history.append(metrics)
        self.clock["train_s"] += metrics.get("time/iteration_s", 0.0)
        self.clock["steps"] += self.steps_per_iteration if not metrics.get("guard/skipped") else 0.0
        self.clock["rows_at_log"] = self.counted["rows"]

    def on_evaluate(self, table: dict[str, Any], images: Any, iteration: int) -> None:
        self.clock["eval_rows"] += self.counted["rows"] - self.clock["rows_at_log"]
        self.clock["rows_at_log"] = self.counted["rows"]
        self.curve.append(
            {
                "iteration": float(iteration),
                "train_s": self.clock["train_s"],
                "gradient_steps": self.clock["steps"],
                "nfe": float(self.counted["rows"] - self.clock["eval_rows"]),
                **scores_of(table, self.reward),
            }
        )


def run_cell(spec: RunSpec, sizes: Sizes, out: Path, threads: int) -> dict[str, Any]:
    """Run one cell in this process and return its record (see the module docstring) with its provenance: the
    key it resumes by, the commit, the threads and what the machine was doing while it ran."""
    clock = MachineClock()
    key = expected_key(spec, sizes, out, threads)
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    record = run_base(spec, sizes, out) if spec.phase == "base" else train_cell(spec, sizes, out)
    provenance = {"key": key, "code_hash": code_hash(), "git": git_state(), "threads": threads}
    return {**record, **provenance, "machine": clock.finish()}


def train_cell(spec: RunSpec, sizes: Sizes, out: Path) -> dict[str, Any]:
    """Train one cell's stage and return its curve, costs and per-iteration statistics."""
    config = stage_config(spec, sizes, eval_prompt_file(out, spec.reward, spec.split, sizes))
    counted = {"rows": 0}
    forward = SD3Transformer2DModel.forward

    def counting_forward(self: Any, hidden_states: Any, *a: Any, **kw: Any) -> Any:
        counted["rows"] += int(hidden_states.shape[0])
        return forward(self, hidden_states, *a, **kw)

    # mypy cannot resolve diffusers' model classes' mixin bases, so it sees no nn.Module.forward to assign
    SD3Transformer2DModel.forward = counting_forward  # type: ignore[attr-defined]
    steps_per_iteration = float(config.optim.gradient_steps)
    recorder = CurveRecorder(spec.reward, steps_per_iteration, counted)

    work = out / "work" / spec.name
    started = time.perf_counter()
    diverged = None
    try:
        run_stage(
            config,
            pipeline_dir=Path(config.pipeline),
            work_dir=work,
            out_dir=work / "adapter",
            root=ROOT,
            callbacks=recorder,
        )
    except TrainingDiverged as exc:  # a collapse is a result of the grid, not a failure of it
        diverged = str(exc)
    history, curve = recorder.history, recorder.curve
    ok = [h for h in history if not h.get("guard/skipped")]

    def mean(key: str) -> float | None:
        values = [h[key] for h in ok if key in h]
        return sum(values) / len(values) if values else None

    return {
        "spec": asdict(spec),
        "name": spec.name,
        "curve": curve,
        "wall_s": time.perf_counter() - started,
        "diverged": diverged,
        "skipped_iterations": len(history) - len(ok),
        "samples_per_iteration": config.rollout.prompts_per_iteration * config.rollout.group_size,
        "gradient_steps_per_iteration": steps_per_iteration,
        "time_split_s": {k: mean(f"time/{k}_s") for k in ("rollout", "reward", "prepare", "update", "iteration")},
        "surrogate_cv": mean("surrogate/cv"),
        "surrogate_cv_within_group": mean("surrogate/cv_within_group"),
        "train_reward": [h.get("reward/total_mean") for h in history],
        "grad_norm_per_iteration": [h.get("train/grad_norm") for h in history],
        "surrogate_mean_per_iteration": [h.get("surrogate/mean") for h in history],
        "surrogate_cv_per_iteration": [h.get("surrogate/cv") for h in ok],
        "surrogate_cv_within_group_per_iteration": [h.get("surrogate/cv_within_group") for h in ok],
        # the plateau diagnosis's series, one value per logged iteration (None where it did not log the metric)
        **{d.record_key: [h.get(d.metric) for h in history] for d in NEW_SERIES},
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "config": config.model_dump(mode="json"),
    }
