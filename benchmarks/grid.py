"""The comparison grid's plan: the reward settings, each method's recipe, the ablations, the learning-rate sweep,
the sizes each phase trains at, the cells of each phase and the stage config each cell trains with.

The phases (:data:`PHASES`) and what each cell records are described in :mod:`benchmarks.compare`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import GENEVAL_TAGS, METHODS, ROOT
from vgrpo.config import StageConfig, load_config
from vgrpo.world import make_splits, read_jsonl, scene_to_dict, write_jsonl
from vgrpo.world.config import PretrainConfig

# The two reward settings: the GenEval stage (world GenEval, GenEval's strict verdict as the stage trains it) and
# the preference stage's mix of world PickScore and world CLIPScore. ``score`` is the per-prompt number the report
# resamples: the strict credit of each image, or the prompt's mean PickScore.
REWARDS: dict[str, dict[str, Any]] = {
    "geneval": {
        "stage": "params/stages/embedded/2-geneval.yaml",
        "eval_rewards": [{"name": "geneval"}],
        "tags": GENEVAL_TAGS,
    },
    "preference": {
        "stage": "params/stages/embedded/1-preference.yaml",
        "eval_rewards": [
            {"name": "pickscore", "key": "world_pickscore", "options": {"path": "models/world-pickscore"}},
            {"name": "clipscore", "key": "world_clipscore", "options": {"path": "models/world-clip"}},
        ],
        "tags": (*GENEVAL_TAGS, "ocr"),
    },
}

# Each method's own recipe (its params/algorithms preset) on the GenEval stage's rollout (8 prompts x 8 samples,
# 10 Euler/SDE steps, two half-batch gradient steps per iteration): N_MC 4 for the ELBO methods (the paper's
# default); MixGRPO's window advances every 3 iterations so that it sweeps the 10 steps within a run. The embedded
# rollout (10 steps, unshifted) replaces MixGRPO's own 25 steps at shift 3; the uniform grid and the population std
# are the settings the recorded comparison (docs/benchmarks) ran with, before the Flow-GRPO preset took the SD3
# pipeline's grid and the MixGRPO preset torch's unbiased std.
METHOD_OVERRIDES: dict[str, dict[str, Any]] = {
    "vgrpo": {"algorithm": {"n_mc": 4}},
    "naive_elbo": {"algorithm": {"n_mc": 4}},
    "flow_grpo": {"rollout": {"schedule": "uniform"}},
    "mixgrpo": {
        "algorithm": {"shift_interval": 3},
        "rollout": {"num_steps": 10, "shift": None},
        "advantage": {"std_ddof": 0},
    },
    "diffusion_nft": {},
}

# The paper's variance-reduction ablations on V-GRPO (its Fig. 4 / Table 3 rows).
ABLATIONS: dict[str, dict[str, Any]] = {
    "n_mc_2": {"algorithm": {"n_mc": 2}},
    "n_mc_8": {"algorithm": {"n_mc": 8}},
    "v_prediction": {"algorithm": {"prediction": "v"}},
    "eps_prediction": {"algorithm": {"prediction": "eps"}},
}

SWEEP_LRS = (1e-4, 2e-4, 4e-4)  # around the GenEval stage's 2e-4, a factor 2 apart
SWEEP_BOUNDS = (5e-5, 8e-4)  # a best rate at an edge of the sweep is tried one factor 2 further, within these


@dataclass(frozen=True)
class Sizes:
    """How long each phase's cells train and what they are scored on."""

    iterations: int = 50  # methods, ablations
    eval_every: int = 10
    preference_iterations: int = 30
    sweep_iterations: int = 15
    stability_iterations: int = 20
    seeds: int = 3
    stability_seeds: int = 5
    test_prompts: int = 128  # x eval_group images on the test split (GenEval tags only)
    val_prompts: int = 64  # x eval_group images on the validation split
    eval_group: int = 4
    eval_steps: int = 10
    prompts: int = 8  # per iteration
    group: int = 8


QUICK = Sizes(iterations=30, eval_every=30, seeds=1)


@dataclass(frozen=True)
class RunSpec:
    """One cell of the grid."""

    phase: str  # base | sweep | methods | stability | ablation | preference
    method: str
    reward: str = "geneval"
    lr: float = 2e-4
    seed: int = 0
    variant: str = "default"
    iterations: int = 30
    eval_every: int = 10
    split: str = "test"  # the prompts its evaluations score: test | val
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        if self.phase == "base":
            return f"base-{self.reward}-{self.split}"
        return f"{self.phase}-{self.reward}-{self.method}-{self.variant}-lr{self.lr:g}-s{self.seed}"


PHASES = ("base", "sweep", "methods", "stability", "ablation", "preference")


def eval_prompt_file(out: Path, reward: str, split: str, sizes: Sizes) -> Path:
    """The fixed evaluation prompts every cell of ``reward`` shares: the first test prompts of the reward's tags,
    or a validation split drawn from the world's generator with its own seed (never the test split)."""
    path = out / "prompts" / f"{reward}-{split}.jsonl"
    if path.is_file():
        return path
    tags = REWARDS[reward]["tags"]
    if split == "test":
        rows = [r for r in read_jsonl(ROOT / "data/world/test.jsonl") if r["tag"] in tags][: sizes.test_prompts]
    else:
        world = load_config([ROOT / "params/embedded/pretrain.yaml"], section="pretrain", schema=PretrainConfig)
        # Drawn like the test split (held-out colour pairs included) from a seed no other split uses.
        _, records = make_splits(
            world.seed + 7919, 0, 4 * sizes.val_prompts, held_out_pairs=world.held_out_pairs, tags=world.split_tags
        )
        rows = [{**md, "scene": scene_to_dict(sc)} for md, sc in records if md["tag"] in tags][: sizes.val_prompts]
    write_jsonl(path, rows)
    return path


def plan_phase(phase: str, sizes: Sizes, best_lr: dict[str, float], quick: bool) -> list[RunSpec]:
    """The cells of one phase (``best_lr``: each method's learning rate from the sweep)."""
    it, every = sizes.iterations, sizes.eval_every
    if phase == "base":
        splits = ("test",) if quick else ("test", "val")
        rewards = ("geneval",) if quick else ("geneval", "preference")
        return [RunSpec("base", "base", r, split=s) for r in rewards for s in splits if (r, s) != ("preference", "val")]
    if quick:
        if phase != "methods":
            return []
        return [
            RunSpec("methods", m, lr=lr, iterations=it, eval_every=every)
            for lr in (2e-4, 4e-4)
            for m in ("vgrpo", "naive_elbo")
        ]
    if phase == "sweep":
        return [
            RunSpec(
                "sweep", m, lr=lr, iterations=sizes.sweep_iterations, eval_every=sizes.sweep_iterations, split="val"
            )
            for m in METHODS
            for lr in SWEEP_LRS
        ]
    if phase == "methods":
        return [
            RunSpec("methods", m, lr=best_lr[m], seed=s, iterations=it, eval_every=every)
            for s in range(sizes.seeds)
            for m in METHODS
        ]
    if phase == "stability":
        lr = 2 * best_lr["vgrpo"]
        n = sizes.stability_iterations
        return [
            RunSpec("stability", m, lr=lr, seed=s, iterations=n, eval_every=n)
            for s in range(sizes.stability_seeds)
            for m in ("vgrpo", "naive_elbo")
        ]
    if phase == "ablation":
        return [
            RunSpec("ablation", "vgrpo", lr=best_lr["vgrpo"], variant=v, overrides=o, iterations=it, eval_every=every)
            for v, o in ABLATIONS.items()
        ]
    if phase == "preference":
        n = sizes.preference_iterations
        return [
            RunSpec("preference", m, "preference", lr=5e-4, seed=s, iterations=n, eval_every=every)
            for s in range(sizes.seeds)
            for m in ("vgrpo", "naive_elbo")
        ]
    raise ValueError(f"unknown phase {phase!r}")


def sweep_scores(out: Path) -> dict[str, dict[float, float]]:
    """Each method's validation strict credit per learning rate tried, from the sweep's records."""
    tried: dict[str, dict[float, float]] = {}
    for path in sorted(out.glob("sweep-*.json")):
        rec = json.loads(path.read_text())
        score = rec["curve"][-1]["score"] if rec["curve"] else float("-inf")
        tried.setdefault(rec["spec"]["method"], {})[rec["spec"]["lr"]] = score
    return tried


def best_rate(scores: dict[float, float]) -> float:
    """The rate with the highest score (ties: the smaller rate)."""
    return max(scores, key=lambda lr: (scores[lr], -lr))


def sweep_extensions(out: Path, sizes: Sizes) -> list[RunSpec]:
    """Sweep cells one factor 2 beyond a method's best rate when that rate is at the edge of what it tried (a best
    at the edge says the optimum may lie outside), within :data:`SWEEP_BOUNDS`."""
    specs = []
    for method, scores in sweep_scores(out).items():
        best = best_rate(scores)
        for lr in (best * 2, best / 2):
            edge = best == (max(scores) if lr > best else min(scores))
            if edge and lr not in scores and SWEEP_BOUNDS[0] <= lr <= SWEEP_BOUNDS[1]:
                specs.append(
                    RunSpec(
                        "sweep",
                        method,
                        lr=lr,
                        iterations=sizes.sweep_iterations,
                        eval_every=sizes.sweep_iterations,
                        split="val",
                    )
                )
    return specs


def best_learning_rates(out: Path) -> dict[str, float]:
    """Each method's sweep learning rate with the highest validation strict credit (ties: the smaller rate)."""
    tried = sweep_scores(out)
    missing = [m for m in METHODS if m not in tried]
    if missing:
        raise RuntimeError(f"the sweep has no finished cell for {missing}: run the grid again to finish it")
    return {m: best_rate(scores) for m, scores in tried.items()}


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def stage_config(spec: RunSpec, sizes: Sizes, eval_prompts: Path) -> StageConfig:
    """The cell's stage config: the base, model, reward stage and method files, the bench's overrides on top."""
    reward = REWARDS[spec.reward]
    files = [
        ROOT / "params/base.yaml",
        ROOT / "params/models/embedded.yaml",
        ROOT / reward["stage"],
        ROOT / "params/algorithms" / f"{spec.method}.yaml",
    ]
    overrides: dict[str, Any] = {
        "name": spec.name,
        "seed": spec.seed,
        "iterations": spec.iterations,
        "checkpoint_every": spec.iterations,
        "eval_every": spec.eval_every,
        "eval_at_start": False,
        "eval_prompts": str(eval_prompts),
        "rollout": {"prompts_per_iteration": sizes.prompts, "group_size": sizes.group, "micro_batch_size": 64},
        "optim": {"lr": spec.lr, "micro_batch_size": 64},
        "evaluation": {
            "group_size": sizes.eval_group,
            "num_steps": sizes.eval_steps,
            "max_prompts": None,
            "seed": 0,
            "rewards": reward["eval_rewards"],
        },
    }
    overrides = _merge(_merge(overrides, METHOD_OVERRIDES[spec.method]), spec.overrides)
    return load_config(files, overrides, schema=StageConfig)
