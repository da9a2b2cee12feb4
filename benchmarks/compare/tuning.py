"""Benchmark v3's tuning sweep: each method's recipe candidates and learning rates at the horizon the grid runs
(80 iterations), scored on the validation prompts, with the stability criterion fixed before the sweep ran.

    python -m benchmarks.compare.tuning --workers 2 --threads 1   # resumable: run it again to continue
    python -m benchmarks.compare.tuning --report-only              # docs/benchmarks-v3/tuning.md from the records

Why a sweep of its own: the v2 sweep chose rates at 30 iterations for runs of 80 (a rate that collapses late was
chosen), and tuned only the rate of recipes compressed for the 10-step world (MixGRPO's window swept all 10 steps
every 21 iterations). Here each baseline's candidates are its v2 recipe and its official code's recipe scaled to
this world (``docs/benchmarks/v3-preregistration.md`` gives the sources and the reasons), each at three rates.

The criterion (:data:`DROP_MARGIN`, :func:`stable`, :func:`choose`), fixed before the first tuning cell:

- a rung (method, recipe, rate) is *stable* when on every seed its final validation score is at most
  ``DROP_MARGIN`` below that seed's best evaluation point, no point lies more than :data:`COLLAPSE_MARGIN`
  below the base, and the cell did not diverge;
- each method's choice is its stable rung with the highest seed-mean final score (ties: the smaller rate);
- while a recipe's best stable rung is at an edge of the rates it tried, the next rate out (a factor 2) is added,
  within :data:`RATE_BOUNDS` (a best rung at the edge says the optimum may lie beyond it).
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import ROOT
from benchmarks.compare import tuning_runs
from benchmarks.compare.plan import RunSpec
from benchmarks.compare.rungs import BASE as BASE  # the names the sweep's readers import from here
from benchmarks.compare.rungs import Rung as Rung
from benchmarks.compare.rungs import Sweep
from benchmarks.compare.tuning_report import ReportText
from benchmarks.compare.tuning_report import report as sweep_report

# A method's candidate recipes: name -> overrides on the grid's own (benchmarks.compare.plan.METHOD_OVERRIDES).
# ``v2`` is the recipe the v2 grid ran; the others follow each method's official code, scaled to 10 steps and 80
# iterations (the reasons: docs/benchmarks/v3-preregistration.md#baselines-settings).
RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    "vgrpo": {"v2": {}},
    "naive_elbo": {"v2": {}},
    "flow_grpo": {
        "v2": {},
        # the later release's fixed training steps (every SDE step but the last) and its KL strength (0.04 with
        # the official denominator is kl_coef 0.004 on this 10-step grid)
        "official": {"algorithm": {"kl_coef": 0.004, "timestep_order": "first"}},
        # the same with the clip range widened for a log-prob averaged over 1,024 latent dimensions, not 65,536
        "official-clip8e-4": {"algorithm": {"kl_coef": 0.004, "timestep_order": "first", "clip_range": 8e-4}},
    },
    "mixgrpo": {
        "v2": {},
        # the official run's window: 16% of the steps (4 of 25 -> 2 of 10), advancing over the first 60% of the
        # trajectory once in the run (starts 0..4, every 16 iterations), one initial noise per group
        "official": {
            "algorithm": {"window_size": 2, "shift_interval": 16},
            "rollout": {"group_noise": "shared"},
        },
        "official-own-noise": {"algorithm": {"window_size": 2, "shift_interval": 16}},
    },
    "diffusion_nft": {
        "v2": {},
        # 9 of the 10 grid timesteps per sample (stratified), the batch-wide std, and the old policy's decay rate
        # per gradient step (0.001) counted per iteration (2 gradient steps)
        "official": {
            "algorithm": {"n_mc": 9, "timestep_sampling": "stratified", "ema_decay_rate": 0.002},
            "advantage": {"std_scope": "global"},
        },
    },
}
RATES: dict[str, tuple[float, ...]] = {  # around each method's v2 choice (V-GRPO, naive, MixGRPO 8e-4; others 1.6e-3)
    "vgrpo": (4e-4, 8e-4, 1.6e-3),
    "naive_elbo": (4e-4, 8e-4, 1.6e-3),
    "flow_grpo": (8e-4, 1.6e-3, 3.2e-3),
    "mixgrpo": (4e-4, 8e-4, 1.6e-3),
    "diffusion_nft": (8e-4, 1.6e-3, 3.2e-3),
}
RATE_BOUNDS = (1e-4, 1.28e-2)
TUNING_SEED0 = 1500  # fresh: no v2 cell and no other v3 phase uses 1500-1599
TUNING_SEEDS = 2
DROP_MARGIN = 0.08  # validation strict: a final this far below the seed's own best point is a late collapse
COLLAPSE_MARGIN = 0.10  # validation strict below the base at any point (the grid's collapse margin)
ITERATIONS, EVAL_EVERY = 80, 10

# The order the first rungs run in: the recipes the v2 grid lacked (the weak baselines' official ones) and V-GRPO's
# rates at the horizon first, the v2 recipes at the horizon last (what an interrupted sweep has settled first).
ORDER = (
    ("mixgrpo", "official"),
    ("flow_grpo", "official"),
    ("vgrpo", "v2"),
    ("diffusion_nft", "official"),
    ("naive_elbo", "v2"),
    ("mixgrpo", "official-own-noise"),
    ("flow_grpo", "official-clip8e-4"),
    ("mixgrpo", "v2"),
    ("flow_grpo", "v2"),
    ("diffusion_nft", "v2"),
)


V3 = Sweep(
    recipes=RECIPES,
    rates=RATES,
    order=ORDER,
    rate_bounds=RATE_BOUNDS,
    seed0=TUNING_SEED0,
    seeds=TUNING_SEEDS,
    iterations=ITERATIONS,
    eval_every=EVAL_EVERY,
    drop_margin=DROP_MARGIN,
    collapse_margin=COLLAPSE_MARGIN,
)
"""Benchmark v3's sweep: the rule and the plan (:mod:`benchmarks.compare.rungs`) on the candidates above."""

tuning_spec = V3.spec
rung_of = V3.rung_of
stable = V3.stable
tuning_cells = V3.tuning_cells
rungs = V3.rungs
best_stable = V3.best_stable
extensions = V3.extensions
plan = V3.plan
choose = V3.choose
chosen_as_methods = V3.chosen_as_methods
TEXT = ReportText(
    "v3", "`benchmarks/compare/tuning.py` states the recipes, the rates and the criterion", "the grid's horizon"
)


def report(records: dict[str, dict[str, Any]], planned: list[RunSpec], command: str) -> str:
    return sweep_report(V3, TEXT, records, planned, command)


def main(argv: list[str] | None = None) -> int:
    prog, description = "python -m benchmarks.compare.tuning", __doc__.splitlines()[0]
    docs, out = ROOT / "docs" / "benchmarks-v3", ROOT / "runs" / "bench" / "v3-tuning"
    args = tuning_runs.parser(prog, description, out, docs).parse_args(argv)
    return tuning_runs.run(V3, args, lambda records, planned: report(records, planned, prog))


if __name__ == "__main__":
    raise SystemExit(main())
