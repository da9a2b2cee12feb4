"""V-GRPO against naive ELBO-GRPO, Flow-GRPO, MixGRPO and DiffusionNFT, and the paper's ablations, on the
embedded base, under the protocol written at the top of the report (benchmarks/report.py, ``PROTOCOL``).

    python benchmarks/compare.py --quick        # V-GRPO against naive ELBO-GRPO on the GenEval reward
    python benchmarks/compare.py                # the full grid (resumable: run it again to continue)
    python benchmarks/compare.py --report-only  # rewrite the report and the MLflow runs from the records

The grid runs in phases; each phase's cells are independent subprocesses (``--workers`` at a time), and a phase
that needs an earlier one's result (each method's learning rate) is planned when that phase is done:

1. ``base``: the base model's evaluation on the test and validation prompt files (what every curve starts from:
   a fresh LoRA is the base exactly, so no cell evaluates its start again).
2. ``sweep``: each method at three learning rates, one seed, scored on the *validation* prompts.
3. ``methods``: each method at its own best learning rate, ``--seeds`` seeds, held-out curve on the test prompts.
4. ``stability``: V-GRPO and naive ELBO-GRPO at twice V-GRPO's best learning rate, five seeds.
5. ``ablation``: V-GRPO's variance-reduction techniques one at a time (N_MC 2 and 8, v- and eps-prediction).
6. ``preference``: V-GRPO and naive ELBO-GRPO on the preference stage's rewards.

Each cell trains one stage (:func:`vgrpo.training.stage.run_stage`) from ``models/embedded-base`` with
``params/base.yaml`` + ``params/models/embedded.yaml`` + the reward's stage file + the method's
``params/algorithms`` preset + the bench's overrides, and writes one JSON record (atomically): its held-out curve
against training wall time, gradient steps and transformer evaluations (NFE, counted by a hook), the per-image
scores of every evaluation point (what the report's bootstrap resamples), its per-iteration time split, peak
memory and surrogate-CV statistics. A cell whose record exists is skipped, so a killed grid resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("vgrpo", "naive_elbo", "flow_grpo", "mixgrpo", "diffusion_nft")
GENEVAL_TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")

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


def eval_prompt_file(out: Path, reward: str, split: str, sizes: Sizes) -> Path:
    """The fixed evaluation prompts every cell of ``reward`` shares: the first test prompts of the reward's tags,
    or a validation split drawn from the world's generator with its own seed (never the test split)."""
    from vgrpo.config import load_config
    from vgrpo.world import make_splits, read_jsonl, scene_to_dict, write_jsonl
    from vgrpo.world.config import PretrainConfig

    path = out / "prompts" / f"{reward}-{split}.jsonl"
    if path.is_file():
        return path
    tags = REWARDS[reward]["tags"]
    if split == "test":
        rows = [r for r in read_jsonl(ROOT / "data/world/test.jsonl") if r["tag"] in tags][: sizes.test_prompts]
    else:
        world = load_config([ROOT / "params/embedded/pretrain.yaml"], section="pretrain", schema=PretrainConfig)
        # Drawn like the test split (held-out colour pairs included) from a seed no other split uses.
        _, records = make_splits(world.seed + 7919, 0, 4 * sizes.val_prompts, held_out_pairs=world.held_out_pairs,
                                 tags=world.split_tags)  # fmt: skip
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
        return [RunSpec("methods", m, lr=lr, iterations=it, eval_every=every)
                for lr in (2e-4, 4e-4) for m in ("vgrpo", "naive_elbo")]  # fmt: skip
    if phase == "sweep":
        return [RunSpec("sweep", m, lr=lr, iterations=sizes.sweep_iterations, eval_every=sizes.sweep_iterations,
                        split="val") for m in METHODS for lr in SWEEP_LRS]  # fmt: skip
    if phase == "methods":
        return [RunSpec("methods", m, lr=best_lr[m], seed=s, iterations=it, eval_every=every)
                for s in range(sizes.seeds) for m in METHODS]  # fmt: skip
    if phase == "stability":
        lr = 2 * best_lr["vgrpo"]
        n = sizes.stability_iterations
        return [RunSpec("stability", m, lr=lr, seed=s, iterations=n, eval_every=n)
                for s in range(sizes.stability_seeds) for m in ("vgrpo", "naive_elbo")]  # fmt: skip
    if phase == "ablation":
        return [RunSpec("ablation", "vgrpo", lr=best_lr["vgrpo"], variant=v, overrides=o, iterations=it,
                        eval_every=every) for v, o in ABLATIONS.items()]  # fmt: skip
    if phase == "preference":
        n = sizes.preference_iterations
        return [RunSpec("preference", m, "preference", lr=5e-4, seed=s, iterations=n, eval_every=every)
                for s in range(sizes.seeds) for m in ("vgrpo", "naive_elbo")]  # fmt: skip
    raise ValueError(f"unknown phase {phase!r}")


PHASES = ("base", "sweep", "methods", "stability", "ablation", "preference")


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
                specs.append(RunSpec("sweep", method, lr=lr, iterations=sizes.sweep_iterations,
                                     eval_every=sizes.sweep_iterations, split="val"))  # fmt: skip
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


def stage_config(spec: RunSpec, sizes: Sizes, eval_prompts: Path) -> Any:
    from vgrpo.config import StageConfig, load_config

    reward = REWARDS[spec.reward]
    files = [ROOT / "params/base.yaml", ROOT / "params/models/embedded.yaml", ROOT / reward["stage"],
             ROOT / "params/algorithms" / f"{spec.method}.yaml"]  # fmt: skip
    overrides: dict[str, Any] = {
        "name": spec.name, "seed": spec.seed, "iterations": spec.iterations, "checkpoint_every": spec.iterations,
        "eval_every": spec.eval_every, "eval_at_start": False, "eval_prompts": str(eval_prompts),
        "rollout": {"prompts_per_iteration": sizes.prompts, "group_size": sizes.group, "micro_batch_size": 64},
        "optim": {"lr": spec.lr, "micro_batch_size": 64},
        "evaluation": {"group_size": sizes.eval_group, "num_steps": sizes.eval_steps, "max_prompts": None,
                       "seed": 0, "rewards": reward["eval_rewards"]},
    }  # fmt: skip
    overrides = _merge(_merge(overrides, METHOD_OVERRIDES[spec.method]), spec.overrides)
    return load_config(files, overrides, schema=StageConfig)


def scores_of(table: dict[str, Any], reward: str) -> dict[str, Any]:
    """What the report needs from an evaluation table: the headline numbers and the per-prompt scores."""
    pp = table["per_prompt"]
    if reward == "geneval":
        g = table["rewards"]["geneval"]
        credited = pp["credited"]
        return {"score": float(g["geneval_strict"]), "partial": float(g["geneval_partial"]),
                "per_prompt": [sum(map(bool, c)) / len(c) for c in credited], "tags": pp["tag"]}  # fmt: skip
    pick = table["rewards"]["world_pickscore"]
    return {"score": float(pick["mean"]), "clipscore": float(table["rewards"]["world_clipscore"]["mean"]),
            "per_prompt": [float(v) for v in pp["world_pickscore"]["mean"]], "tags": pp["tag"]}  # fmt: skip


def run_base(spec: RunSpec, sizes: Sizes, out: Path) -> dict[str, Any]:
    """The base model's evaluation (the start of every curve)."""
    from vgrpo.evaluation.evaluator import Sampling, evaluate
    from vgrpo.models.pipeline import build_adapter, load_pipeline
    from vgrpo.rewards.multi import MultiReward
    from vgrpo.world import read_jsonl

    pipe = load_pipeline(ROOT / "models/embedded-base")
    adapter, policy = build_adapter(pipe)
    rows = read_jsonl(eval_prompt_file(out, spec.reward, spec.split, sizes))
    rewards = MultiReward.from_specs(REWARDS[spec.reward]["eval_rewards"])
    t0 = time.perf_counter()
    table, _ = evaluate(adapter=adapter, policy=policy, metadata=rows, rewards=rewards, group_size=sizes.eval_group,
                        sampling=Sampling(sizes.eval_steps, 0, adapter.sigma_shift(None, dynamic=False)))  # fmt: skip
    point = {"iteration": 0.0, "train_s": 0.0, "gradient_steps": 0.0, "nfe": 0.0, **scores_of(table, spec.reward)}
    return {"spec": asdict(spec), "name": spec.name, "curve": [point], "wall_s": time.perf_counter() - t0}


def run_cell(spec: RunSpec, sizes: Sizes, out: Path, threads: int) -> dict[str, Any]:
    """Train one cell in this process and return its record (see the module docstring)."""
    import torch
    from diffusers import SD3Transformer2DModel

    from vgrpo.training.guards import TrainingDiverged
    from vgrpo.training.stage import run_stage

    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    if spec.phase == "base":
        return run_base(spec, sizes, out)
    config = stage_config(spec, sizes, eval_prompt_file(out, spec.reward, spec.split, sizes))
    counted = {"rows": 0}
    forward = SD3Transformer2DModel.forward

    def counting_forward(self: Any, hidden_states: Any, *a: Any, **kw: Any) -> Any:
        counted["rows"] += int(hidden_states.shape[0])
        return forward(self, hidden_states, *a, **kw)

    SD3Transformer2DModel.forward = counting_forward  # type: ignore[method-assign]
    curve: list[dict[str, Any]] = []
    history: list[dict[str, float]] = []
    clock = {"train_s": 0.0, "eval_rows": 0, "rows_at_log": 0, "steps": 0.0}
    steps_per_iteration = float(config.optim.gradient_steps)

    def log(metrics: dict[str, float], iteration: int) -> None:
        history.append(metrics)
        clock["train_s"] += metrics.get("time/iteration_s", 0.0)
        clock["steps"] += steps_per_iteration if not metrics.get("guard/skipped") else 0.0
        clock["rows_at_log"] = counted["rows"]

    def on_eval(table: dict[str, Any], images: Any, iteration: int) -> None:
        clock["eval_rows"] += counted["rows"] - clock["rows_at_log"]
        clock["rows_at_log"] = counted["rows"]
        curve.append({"iteration": float(iteration), "train_s": clock["train_s"], "gradient_steps": clock["steps"],
                      "nfe": float(counted["rows"] - clock["eval_rows"]), **scores_of(table, spec.reward)})  # fmt: skip

    work = out / "work" / spec.name
    started = time.perf_counter()
    diverged = None
    try:
        run_stage(config, pipeline_dir=Path(config.pipeline), work_dir=work, out_dir=work / "adapter", root=ROOT,
                  log=log, on_eval=on_eval)  # fmt: skip
    except TrainingDiverged as exc:  # a collapse is a result of the grid, not a failure of it
        diverged = str(exc)
    ok = [h for h in history if not h.get("guard/skipped")]

    def mean(key: str) -> float | None:
        values = [h[key] for h in ok if key in h]
        return sum(values) / len(values) if values else None

    return {
        "spec": asdict(spec), "name": spec.name, "curve": curve, "wall_s": time.perf_counter() - started,
        "diverged": diverged, "skipped_iterations": len(history) - len(ok),
        "samples_per_iteration": config.rollout.prompts_per_iteration * config.rollout.group_size,
        "gradient_steps_per_iteration": steps_per_iteration, "threads": threads,
        "time_split_s": {k: mean(f"time/{k}_s") for k in ("rollout", "reward", "prepare", "update", "iteration")},
        "surrogate_cv": mean("surrogate/cv"), "surrogate_cv_within_group": mean("surrogate/cv_within_group"),
        "train_reward": [h.get("reward/total_mean") for h in history],
        "surrogate_cv_per_iteration": [h.get("surrogate/cv") for h in ok],
        "surrogate_cv_within_group_per_iteration": [h.get("surrogate/cv_within_group") for h in ok],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "config": config.model_dump(mode="json"),
    }  # fmt: skip


def run_phase(specs: list[RunSpec], args: argparse.Namespace, out: Path, started: float) -> None:
    """Run the phase's missing cells, ``args.workers`` subprocesses at a time."""
    todo = [s for s in specs if not (out / f"{s.name}.json").is_file()]
    running: list[tuple[RunSpec, subprocess.Popen[bytes], float]] = []
    (out / "logs").mkdir(parents=True, exist_ok=True)
    while todo or running:
        while todo and len(running) < args.workers:
            spec = todo.pop(0)
            cmd = [sys.executable, __file__, "--cell", json.dumps(asdict(spec)), "--out", str(out),
                   "--threads", str(args.threads)] + (["--quick"] if args.quick else [])  # fmt: skip
            with open(out / "logs" / f"{spec.name}.log", "wb") as log:
                proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                        env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
            running.append((spec, proc, time.perf_counter()))
        time.sleep(2)
        for item in list(running):
            spec, proc, t0 = item
            if proc.poll() is None:
                continue
            running.remove(item)
            status = "ok" if proc.returncode == 0 else f"FAILED (rc {proc.returncode}; logs/{spec.name}.log)"
            print(f"[{(time.perf_counter() - started) / 60:5.1f} min] {spec.name}: {status} in "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
            record_elapsed(out, args, started)


def record_elapsed(out: Path, args: argparse.Namespace, started: float) -> None:
    """This invocation's elapsed time in ``grid.json`` (one entry per invocation: a killed grid's time counts)."""
    from vgrpo.atomic import write_json_atomic

    grid = out / "grid.json"
    history = json.loads(grid.read_text()) if grid.is_file() else []
    entry = {"started_at": args.started_at, "elapsed_s": time.perf_counter() - started, "workers": args.workers,
             "threads": args.threads}  # fmt: skip
    history = [h for h in history if h.get("started_at") != args.started_at] + [entry]
    write_json_atomic(grid, history)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="V-GRPO against naive ELBO-GRPO only (GenEval)")
    parser.add_argument("--out", default=None, help="records folder (default runs/bench/quick or runs/bench/full)")
    parser.add_argument("--workers", type=int, default=1, help="cells trained at once")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per cell")
    parser.add_argument("--phases", nargs="*", default=list(PHASES), choices=PHASES, help="phases to run")
    parser.add_argument("--seeds", type=int, default=None, help="training seeds per method (default 3; quick 1)")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--docs", default=None, help="report folder (default docs/benchmarks[-quick])")
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI"),
                        help="MLflow store for the cells (default sqlite under the records folder)")  # fmt: skip
    parser.add_argument("--cell", help="(internal) run this cell's spec JSON in this process")
    args = parser.parse_args()
    sizes = QUICK if args.quick else Sizes()
    if args.seeds is not None:
        sizes = replace(sizes, seeds=args.seeds)
    out = Path(args.out or ROOT / "runs" / "bench" / ("quick" if args.quick else "full")).resolve()
    if args.cell:
        from vgrpo.atomic import write_json_atomic

        spec = RunSpec(**json.loads(args.cell))
        write_json_atomic(out / f"{spec.name}.json", run_cell(spec, sizes, out, args.threads))
        return
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    args.started_at = time.strftime("%Y-%m-%dT%H:%M:%S")
    planned: list[str] = []
    for phase in PHASES if args.quick else args.phases:
        needs_lr = phase in ("methods", "stability", "ablation") and not args.quick
        if needs_lr and not any(out.glob("sweep-*.json")):
            continue
        specs = plan_phase(phase, sizes, best_learning_rates(out) if needs_lr else {}, args.quick)
        planned += [s.name for s in specs]
        if not args.report_only:
            run_phase(specs, args, out, started)
        while phase == "sweep" and not args.report_only:
            extra = [s for s in sweep_extensions(out, sizes) if s.name not in planned]  # a failed cell: not again
            if not extra:
                break
            planned += [s.name for s in extra]
            run_phase(extra, args, out, started)
        if phase == "sweep" and args.report_only:
            planned += [p.stem for p in sorted(out.glob("sweep-*.json")) if p.stem not in planned]
    if not args.report_only:  # the grid's elapsed time is the sum of its invocations (it resumes)
        record_elapsed(out, args, started)
    from report import write_report  # benchmarks/report.py, beside this script

    docs = Path(args.docs) if args.docs else ROOT / "docs" / ("benchmarks-quick" if args.quick else "benchmarks")
    command = "python benchmarks/compare.py" + (" --quick" if args.quick else "")
    tracking = args.tracking_uri or f"sqlite:///{out / 'mlflow.db'}"
    write_report(out, docs, command=command, planned=planned, quick=args.quick, tracking_uri=tracking, sizes=sizes)
    print(f"report: {docs / 'README.md'}")


if __name__ == "__main__":
    main()
