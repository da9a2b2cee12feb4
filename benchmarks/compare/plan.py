"""The comparison grid's plan: the reward settings, each method's recipe, the ablations, the learning-rate sweep,
the sizes each phase trains at, the cells of each phase and the stage config each cell trains with.

The phases (:data:`PHASES`) and what each cell records are described in :mod:`benchmarks.compare`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import GENEVAL_TAGS, METHODS, ROOT
from vgrpo.config import StageConfig, load_config
from vgrpo.world import make_splits, scene_to_dict, write_jsonl
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

SWEEP_LADDER = (1e-4, 2e-4, 4e-4, 8e-4)  # every method's first rungs, a factor 2 apart
SWEEP_BOUNDS = (1.25e-5, 6.4e-3)  # a best rung at an edge of the ladder adds the next rung out, within these
SWEEP_SEED0 = 200  # sweep seeds 200, 201, ...: never a seed of another phase, so no sweep cell repeats one
STABILITY_SEED0 = 100  # stability seeds 100, 101, ...: fresh (the methods phase uses 0, 1, ...)
EVAL_SEEDS = {"test": 104729, "val": 7919}  # added to the world's seed: the bench's own draws of each split


@dataclass(frozen=True)
class Sizes:
    """How long each phase's cells train, how many seeds each runs and what they are scored on."""

    iterations: int = 80  # methods, ablations
    eval_every: int = 10
    seeds: int = 5  # methods
    ablation_seeds: int = 3
    preference_iterations: int = 40
    preference_seeds: int = 3
    sweep_iterations: int = 30
    sweep_eval_every: int = 15
    sweep_seeds: int = 2
    stability_iterations: int = 50
    stability_eval_every: int = 5
    stability_seeds: int = 3
    stability_multipliers: tuple[float, ...] = (2.0, 4.0)  # of each method's own best rate
    test_prompts: int = 540  # x eval_group images, GenEval tags, as many of each tag
    preference_prompts: int = 630  # the preference evaluation adds the OCR tag
    val_prompts: int = 240
    eval_group: int = 1  # distinct prompts carry more information than more images of the same prompt
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
    """The fixed evaluation prompts every cell of ``reward`` shares, drawn like the world's test split (held-out
    colour pairs included, every tag equally often) from the world's generator with a seed of the split's own
    (:data:`EVAL_SEEDS`): the test prompts, or a validation split for the sweep that shares no draw with them."""
    n = {"test": sizes.preference_prompts if reward == "preference" else sizes.test_prompts, "val": sizes.val_prompts}
    path = out / "prompts" / f"{reward}-{split}-{n[split]}.jsonl"
    if path.is_file():
        return path
    world = load_config([ROOT / "params/embedded/pretrain.yaml"], section="pretrain", schema=PretrainConfig)
    tags = tuple(t for t in world.split_tags if t in REWARDS[reward]["tags"])
    _, records = make_splits(
        world.seed + EVAL_SEEDS[split], 0, n[split], held_out_pairs=world.held_out_pairs, tags=tags
    )
    write_jsonl(path, [{**md, "scene": scene_to_dict(sc)} for md, sc in records])
    return path


def stage_lr(reward: str) -> float:
    """The learning rate the reward's stage file trains at (the preference stage is not swept)."""
    files = [ROOT / "params/base.yaml", ROOT / "params/models/embedded.yaml", ROOT / REWARDS[reward]["stage"]]
    return float(load_config(files, schema=StageConfig).optim.lr)


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
        return [sweep_spec(m, lr, s, sizes) for m in METHODS for lr in SWEEP_LADDER for s in range(sizes.sweep_seeds)]
    if phase == "methods":
        return [
            RunSpec("methods", m, lr=best_lr[m], seed=s, iterations=it, eval_every=every)
            for s in range(sizes.seeds)
            for m in METHODS
        ]
    if phase == "stability":
        n, k = sizes.stability_iterations, sizes.stability_eval_every
        pref_lr = stage_lr("preference")
        return [
            RunSpec(
                "stability",
                m,
                reward,
                lr=mult * (best_lr[m] if reward == "geneval" else pref_lr),
                seed=STABILITY_SEED0 + s,
                variant=f"x{mult:g}",
                iterations=n,
                eval_every=k,
            )
            for reward in ("geneval", "preference")
            for mult in sizes.stability_multipliers
            for s in range(sizes.stability_seeds)
            for m in ("vgrpo", "naive_elbo")
        ]
    if phase == "ablation":
        return [
            RunSpec(
                "ablation",
                "vgrpo",
                lr=best_lr["vgrpo"],
                seed=s,
                variant=v,
                overrides=o,
                iterations=it,
                eval_every=every,
            )
            for s in range(sizes.ablation_seeds)
            for v, o in ABLATIONS.items()
        ]
    if phase == "preference":
        n = sizes.preference_iterations
        return [
            RunSpec("preference", m, "preference", lr=stage_lr("preference"), seed=s, iterations=n, eval_every=every)
            for s in range(sizes.preference_seeds)
            for m in ("vgrpo", "naive_elbo")
        ]
    raise ValueError(f"unknown phase {phase!r}")


def sweep_spec(method: str, lr: float, seed_index: int, sizes: Sizes) -> RunSpec:
    """One rung of a method's learning-rate ladder for one sweep seed, scored on the validation split."""
    return RunSpec(
        "sweep",
        method,
        lr=lr,
        seed=SWEEP_SEED0 + seed_index,
        iterations=sizes.sweep_iterations,
        eval_every=sizes.sweep_eval_every,
        split="val",
    )


def sweep_scores(records: dict[str, dict[str, Any]], sizes: Sizes) -> dict[str, dict[float, list[float]]]:
    """Each method's final validation strict credit per rung, one value per sweep seed, for the rungs whose
    every seed has finished (a diverged cell scores minus infinity)."""
    tried: dict[str, dict[float, dict[int, float]]] = {}
    seeds = range(SWEEP_SEED0, SWEEP_SEED0 + sizes.sweep_seeds)
    for rec in records.values():
        spec = rec["spec"]
        if spec["phase"] != "sweep" or spec["seed"] not in seeds:
            continue
        score = rec["curve"][-1]["score"] if rec["curve"] and not rec.get("diverged") else float("-inf")
        tried.setdefault(spec["method"], {}).setdefault(spec["lr"], {})[spec["seed"]] = score
    done = {
        m: {lr: [v[s] for s in sorted(v)] for lr, v in by_lr.items() if len(v) >= sizes.sweep_seeds}
        for m, by_lr in tried.items()
    }
    return {m: by_lr for m, by_lr in done.items() if by_lr}


def best_rate(scores: dict[float, list[float]]) -> float:
    """The rung with the highest mean over seeds (ties: the smaller rate). Every seed of every rung scores the same
    validation prompts with the same sampling seeds, so the means differ by the training alone."""
    return max(scores, key=lambda lr: (sum(scores[lr]) / len(scores[lr]), -lr))


def sweep_extensions(records: dict[str, dict[str, Any]], sizes: Sizes) -> list[RunSpec]:
    """The next rung out (a factor 2, every sweep seed) for each method whose best rung is at an edge of what it
    tried: a best at the edge says the optimum may lie outside. Within :data:`SWEEP_BOUNDS`."""
    specs = []
    for method, scores in sweep_scores(records, sizes).items():
        best = best_rate(scores)
        for lr in (best * 2, best / 2):
            edge = best == (max(scores) if lr > best else min(scores))
            if edge and lr not in scores and SWEEP_BOUNDS[0] <= lr <= SWEEP_BOUNDS[1]:
                specs += [sweep_spec(method, lr, s, sizes) for s in range(sizes.sweep_seeds)]
    return specs


def best_learning_rates(records: dict[str, dict[str, Any]], sizes: Sizes) -> dict[str, float]:
    """Each method's best rung (:func:`best_rate`)."""
    tried = sweep_scores(records, sizes)
    missing = [m for m in METHODS if m not in tried]
    if missing:
        raise RuntimeError(f"the sweep has no finished rung for {missing}: run the grid again to finish it")
    return {m: best_rate(scores) for m, scores in tried.items()}


def full_plan(records: dict[str, dict[str, Any]], sizes: Sizes, quick: bool) -> list[RunSpec]:
    """Every cell the grid plans given the records so far: the base and the sweep (with the rungs its finished
    cells add), and the later phases once the sweep has chosen every method's rate."""
    specs = plan_phase("base", sizes, {}, quick) + plan_phase("sweep", sizes, {}, quick)
    if quick:
        return specs + plan_phase("methods", sizes, {}, quick)
    names = {s.name for s in specs}
    while extra := [s for s in sweep_extensions(records, sizes) if s.name not in names]:
        specs += extra
        names |= {s.name for s in extra}
        if not all(s.name in records for s in extra):
            break
    try:
        best = best_learning_rates(records, sizes)
    except RuntimeError:
        return specs
    if any(sweep_extensions(records, sizes)):  # a best rung still at an edge: the sweep is not finished
        return specs
    return specs + [s for p in PHASES[2:] for s in plan_phase(p, sizes, best, quick)]


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
