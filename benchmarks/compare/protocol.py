"""The protocol a benchmark report states at its top, with the sizes its cells ran at: the v2 grid's, the quick
grid's, and benchmarks v3's and v4's (pre-registered); :func:`protocol_lines` picks and fills one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from benchmarks.compare.analysis import N_BOOT
from benchmarks.compare.claim_sets import EQUAL_COST_MARGIN
from benchmarks.compare.claims import CONVERGED_GAIN, E3_MARGIN, MARGIN
from benchmarks.compare.collapse import COLLAPSE_DROP, SPIKE_FACTOR
from benchmarks.compare.method_tables import PLATEAU
from benchmarks.compare.plan import SWEEP_BOUNDS, SWEEP_LADDER, Sizes, stage_lr
from benchmarks.compare.verdicts import NEAR, REFINED
from benchmarks.provenance import LOADED_CORES

if TYPE_CHECKING:
    from benchmarks.compare.registered import Registered

PROTOCOL = """\
## Protocol

- **Model and task.** Every cell trains a LoRA (r 32) on `models/embedded-base`, on the GenEval stage
  (`params/stages/embedded/2-geneval.yaml`: world GenEval, GenEval's strict verdict as the reward) or the
  preference stage (`1-preference.yaml`: world PickScore and CLIPScore), with the same rollout for every method:
  {prompts} prompts x {group} samples per iteration, {steps} sampling steps. Each method adds its own recipe
  (`params/algorithms/<method>.yaml`).
- **Evaluation.** Every evaluation point of every cell scores the same {test_prompts} test prompts (GenEval tags,
  as many of each; the preference stage's {pref_prompts} add OCR prompts) x {eval_group} image, {eval_steps} Euler
  steps, sampling seed 0, so every comparison is paired on prompts and images. The prompts are drawn like the
  world's test split from a seed of the bench's own; the sweep scores a validation draw ({val_prompts} prompts)
  from another seed, never the test prompts. The GenEval score is the mean of the per-tag strict credits.
- **Learning rates.** Each method's rate is a rung of a ladder ({ladder}, a factor 2 apart), {sweep_seeds} seeds x
  {sweep_it} iterations per rung, scored on the validation prompts; the rung with the highest seed mean is chosen,
  and while it is at an edge of the ladder the next rung out is added (within {bounds}).
- **Seeds.** {seeds} training seeds per method ({iterations} iterations, evaluated every {every}); {abl_seeds} per
  ablation, compared with all of V-GRPO's; {pref_seeds} per preference cell ({pref_it} iterations); {stab_seeds}
  fresh seeds per stability cell ({stab_it} iterations, evaluated every {stab_every}) at {mults} each method's own
  rate in both stages.
- **Intervals.** 95% percentile bootstrap ({n_boot} replicates; {refined} for a claim row whose p lies within a
  factor {near:g} of 0.05): prompts resampled within each tag (the same draw for every group of a reward) and each
  group's seeds resampled, so every interval carries the seed spread. A claim row's interval is the hull of that
  and a t interval over seeds (Welch, unbiased variances, the prompts' interaction with the difference added:
  `benchmarks/compare/studentized.py`), since at 3-9 seeds the percentile bootstrap is too narrow.
- **Rules, fixed before the grid ran** (`benchmarks/compare/`: `claims.py`, `analysis.py`). Non-inferiority margin
  {margin_g} GenEval strict ({margin_p} world PickScore); *fails to converge*: a final gain over the base of at most
  {converged}; *adds little*: less than the margin; *collapse*: a divergence, or a drop below the base of more than
  {drop_g} GenEval strict ({drop_p} world PickScore) at any evaluation point; *spike*: an iteration's gradient norm
  or surrogate magnitude above {spike:g}x the median of the cell's first ten; *plateaued*: the last quarter's change
  within +-{plateau}. Efficiency: V-GRPO's score at a fraction r of the other method's budget minus the other's
  score at its full budget, on the paper's axis (iterations for MixGRPO; DiffusionNFT's gradient steps are its
  iterations here, 2 per iteration for every method), wall time as a second row; time to reward is secondary.
- **Verdicts.** Each row's two-sided p-value against its threshold, the larger of the bootstrap's and the t test's
  (so no random stream moves a verdict the t test holds back); the confirmatory rows (the paper's main claims) are
  Holm-corrected together, the exploratory ones are not and say so. The t test, the hull interval, the refined
  replicates, E3's margin (the paper's own 0.03, was 0.02) and the own-rate stability rows were added after the grid
  ran (issue 47): the first three only make a verdict harder to pass; E3's wider margin makes its claim easier
  to reproduce.
- **Machine.** {workers} cell at a time, {threads} torch threads; the runner holds a cell back while other
  processes use more than {loaded} cores, and every cell records the load it ran under (provenance below); the
  clean per-iteration costs against the number of steps are in [speed.md](speed.md).
"""


PROTOCOL_V3 = """\
## Protocol (pre-registered)

The rows, rules, seeds and stopping rule were fixed in
[docs/benchmarks/v3-preregistration.md](../../benchmarks/v3-preregistration.md), committed before the first cell;
any deviation from it is listed there and at the top of this report. The v2 grid
([docs/benchmarks](../../benchmarks/README.md)) is exploratory history.

- **Model, task and evaluation: as v2.** Every cell trains a LoRA (r 32) on `models/embedded-base`, on the GenEval
  stage or the preference stage, {prompts} prompts x {group} samples per iteration, {steps} sampling steps; every
  evaluation point scores the same {test_prompts} test prompts ({pref_prompts} in the preference stage) x
  {eval_group} image, {eval_steps} Euler steps, sampling seed 0, paired across methods; every method is scored by
  its policy alone.
- **Recipes and rates: chosen by the tuning sweep** ([../tuning.md](../tuning.md); its candidates and stability
  criterion committed before its first cell), on the validation prompts at the grid's horizon. Each method's
  recipe and rate are in the table below; the preference stage keeps its own rate ({pref_lr:g}).
- **Seeds, all fresh** (no v2 or tuning seed): {seeds} per method ({iterations} iterations, evaluated every
  {every}); {abl_seeds} per ablation; {pref_seeds} per preference cell ({pref_it} iterations); stress cells at
  {mults} each method's own rate, {stab_seeds} per GenEval cell and {pref_stress} per preference cell, and own-rate
  cells at the same cadence, {own_seeds} per cell ({stab_it} iterations, evaluated every {stab_every}).
- **p-values, intervals and verdicts.** Each row's p is the larger of the two-sided bootstrap p ({n_boot}
  replicates over prompts within tags and each group's seeds; {refined} for a row within a factor {near:g} of 0.05)
  and the t test's (Welch over seeds, unbiased variances, the prompts' interaction added); the interval is the hull
  of the two 95% intervals. The {family} confirmatory rows are Holm-corrected together (a row not run counting as
  p = 1); the estimation rows, which no affordable seed count powers, say so in their note: their interval is the
  result.
- **Rules** as v2 (`benchmarks/compare/claims.py`): non-inferiority margin {margin_g} GenEval strict ({margin_p}
  world PickScore), E3's {e3_margin:g} (the paper's own gap); collapse: a divergence or a drop below the base of
  more than {drop_g} GenEval strict ({drop_p} world PickScore) at any evaluation point.
- **Stopping rule.** Every planned cell runs once; no interim look at a confirmatory statistic; a cell that
  crashes for a machine reason runs again with the same seed, a divergence is data; cells that ran under load keep
  their scores, and their wall times are left out of E4/E5.
- **Machine** (the invocations grid.json records): {machine}. A record says the load its cell ran under.
"""


PROTOCOL_V4 = """\
## Protocol (pre-registered)

The rows, rules, seeds and stopping rule were fixed in [../grid-preregistration.md](../grid-preregistration.md),
committed before the first cell; any deviation from it is listed there and at the top of this report. Benchmark v3
([../../benchmarks-v3/grid/README.md](../../benchmarks-v3/grid/README.md)) is history.

- **Model, task and evaluation: as v3.** Every cell trains a LoRA (r 32) on `models/embedded-base`, on the GenEval
  stage or the preference stage, {prompts} prompts x {group} samples per iteration, {steps} sampling steps; every
  evaluation point scores the same {test_prompts} test prompts ({pref_prompts} in the preference stage) x
  {eval_group} image, {eval_steps} Euler steps, sampling seed 0, paired across methods.
- **Recipes and rates: chosen by the v4 tuning sweep** ([../tuning.md](../tuning.md); its candidates and rule
  committed before its first cell) on the validation prompts at this grid's horizon, V-GRPO's recipe tuned as the
  baselines' were. Each method's recipe and rate are in the table below; the preference cells train each method's
  recipe at the preference stage's own rate ({pref_lr:g}).
- **Seeds, all fresh** (no v2, v3 or tuning seed): {seeds} per method ({iterations} iterations, evaluated every
  {every}) and a replicate group of {rep_seeds} V-GRPO seeds of the same config; {abl_seeds} per ablation;
  {pref_seeds} per preference cell ({pref_it} iterations); stress cells at {mults} each method's own rate,
  {stab_seeds} per GenEval cell and {pref_stress} per preference cell, and own-rate cells at the same cadence,
  {own_seeds} per cell ({stab_it} iterations, evaluated every {stab_every}).
- **p-values, intervals and verdicts: as v3.** Each row's p is the larger of the two-sided bootstrap p ({n_boot}
  replicates over prompts within tags and each group's seeds; {refined} for a row within a factor {near:g} of 0.05)
  and the t test's (Welch over seeds, unbiased variances, the prompts' interaction added); the interval is the hull
  of the two 95% intervals. The {family} confirmatory rows are Holm-corrected together (a row not run or refused
  counting as p = 1).
- **Rules** as v3 (`benchmarks/compare/claims.py`, `claim_sets.py`): non-inferiority margin {margin_g} GenEval
  strict ({margin_p} world PickScore), E3's {e3_margin:g}; V-GRPO against DiffusionNFT at equal iterations,
  transformer evaluations and training seconds, non-inferiority at {cost_margin:g} (an equal-cost row reads both
  methods at the smaller of their full budgets on its axis); collapse: a divergence or a drop below the base of more
  than {drop_g} GenEval strict ({drop_p} world PickScore) at any evaluation point.
- **One machine type per row.** A row whose cells ran on two CPU models or thread counts is refused (no estimate,
  p = 1 in the family).
- **Robustness.** Every verdict is read again from two other random streams and with the replicate V-GRPO group in
  the methods group's place (the tables at the end of the claims).
- **Stopping rule.** Every planned cell runs once; no interim look at a confirmatory statistic; a cell that
  crashes for a machine reason runs again with the same seed, a divergence is data; cells that ran under load keep
  their scores, and their wall times are left out of the rows read in seconds.
- **Machine** (the invocations grid.json records): {machine}. A record says its CPU model and the load its cell
  ran under.
"""
PROTOCOLS = {"v3": PROTOCOL_V3, "v4": PROTOCOL_V4}


QUICK_PROTOCOL = """\
## Protocol (quick)

V-GRPO and naive ELBO-GRPO on the GenEval stage (world GenEval, strict verdict as the reward), {prompts} prompts x
{group} samples per iteration, {iterations} iterations, seed 0, at the stage's learning rate and twice it (no sweep).
Each cell is scored once at the end on the same {test_prompts} test prompts x {eval_group} image as the full grid.
The difference carries a 95% bootstrap interval ({n_boot} replicates) over prompts, resampled within each tag and
paired on prompts and images; it is *resolved* when the interval excludes 0.
"""


def invocation_summary(history: list[dict[str, Any]]) -> str:
    """The grid's invocations grouped by how they ran: ``2 of 1 cell x 2 threads (3.1 h); ...``."""
    groups: dict[tuple[int, int], list[float]] = {}
    for h in history:
        groups.setdefault((int(h.get("workers", 1)), int(h.get("threads", 2))), []).append(float(h["elapsed_s"]))
    if not groups:
        return "none recorded yet"
    return "; ".join(
        f"{len(times)} of {w} cell(s) at a time x {t} thread(s) ({sum(times) / 3600:.1f} h)"
        for (w, t), times in sorted(groups.items())
    )


def protocol_lines(sizes: Sizes, quick: bool, grid: Registered | None, history: list[dict[str, Any]]) -> str:
    """The protocol section with the sizes the cells ran at: the quick grid's, v2's, or a pre-registered grid's."""
    last = history[-1] if history else {}
    if quick:
        return QUICK_PROTOCOL.format(
            prompts=sizes.prompts,
            group=sizes.group,
            iterations=sizes.iterations,
            test_prompts=sizes.test_prompts,
            eval_group=sizes.eval_group,
            n_boot=N_BOOT,
        )
    common = {
        "prompts": sizes.prompts,
        "group": sizes.group,
        "steps": sizes.eval_steps,
        "test_prompts": sizes.test_prompts,
        "pref_prompts": sizes.preference_prompts,
        "eval_group": sizes.eval_group,
        "eval_steps": sizes.eval_steps,
        "seeds": sizes.seeds,
        "iterations": sizes.iterations,
        "every": sizes.eval_every,
        "abl_seeds": sizes.ablation_seeds,
        "pref_seeds": sizes.preference_seeds,
        "pref_it": sizes.preference_iterations,
        "stab_seeds": sizes.stability_seeds,
        "stab_it": sizes.stability_iterations,
        "stab_every": sizes.stability_eval_every,
        "mults": " and ".join(f"{x:g}x" for x in sizes.stability_multipliers),
        "n_boot": N_BOOT,
        "refined": f"{REFINED:,}",
        "near": NEAR,
        "margin_g": MARGIN["geneval"],
        "margin_p": MARGIN["preference"],
        "drop_g": COLLAPSE_DROP["geneval"],
        "drop_p": COLLAPSE_DROP["preference"],
        "workers": last.get("workers", 1),
        "threads": last.get("threads", 2),
    }
    if grid is not None:
        design = grid.design
        return PROTOCOLS[grid.name].format(
            **common,
            pref_lr=stage_lr("preference"),
            pref_stress=design.preference_stress_seeds,
            own_seeds=design.own_rate_seeds,
            rep_seeds=design.replicate_seeds,
            family=len(grid.claims.confirmatory),
            e3_margin=E3_MARGIN,
            cost_margin=EQUAL_COST_MARGIN,
            machine=invocation_summary(history),
        )
    return PROTOCOL.format(
        **common,
        val_prompts=sizes.val_prompts,
        ladder=", ".join(f"{x:g}" for x in SWEEP_LADDER),
        sweep_seeds=sizes.sweep_seeds,
        sweep_it=sizes.sweep_iterations,
        bounds=f"{SWEEP_BOUNDS[0]:g} to {SWEEP_BOUNDS[1]:g}",
        converged=CONVERGED_GAIN,
        spike=SPIKE_FACTOR,
        plateau=PLATEAU,
        loaded=LOADED_CORES,
    )
