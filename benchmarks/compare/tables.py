"""The report's markdown tables: the methods on the GenEval reward (with whether each has plateaued), time to
reward, the learning-rate sweep, stability, the ablations, the preference stage, provenance and the quick grid."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import LABELS, METHODS
from benchmarks.compare.analysis import (
    COLLAPSE_DROP,
    Analysis,
    Group,
    cells,
    collapsed,
    curve_mean,
    drop_of,
    final,
    identity,
    spikes,
)
from benchmarks.compare.bootstrap import first_crossing, interval
from benchmarks.compare.plan import SWEEP_SEED0, Sizes, best_rate, sweep_scores
from benchmarks.provenance import LOADED_CORES

PLATEAU = 0.02  # a curve has plateaued when its last quarter's change lies within +-PLATEAU (95% interval)


def fmt(x: float | None, digits: int = 3) -> str:
    """``x`` to ``digits`` decimals, ``n/a`` when missing."""
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def fmt_ci(low: float, high: float, digits: int = 3, sign: bool = False) -> str:
    """An interval as ``[low, high]`` (``inf`` where a target was never reached)."""

    def f(v: float) -> str:
        return "inf" if math.isinf(v) else (f"{v:+.{digits}f}" if sign else f"{v:.{digits}f}")

    return f"[{f(low)}, {f(high)}]"


def est_ci(an: Analysis, groups: list[tuple[str, Group]], fn: Any, reward: str = "geneval", digits: int = 3) -> str:
    est, reps = an.statistic(groups, fn, reward)
    low, high = interval(reps)
    return f"{est:+.{digits}f} {fmt_ci(low, high, digits, sign=True)}"


def plateau(an: Analysis, key: str, g: Group) -> str:
    """The last quarter's change (final minus the point at 3/4 of the horizon) and what it says."""
    k = int(np.argmin(np.abs(g.iterations - 0.75 * g.iterations[-1])))
    if k == 0 or k == len(g.iterations) - 1:
        return "n/a"
    est, reps = an.statistic([(key, g)], lambda c: c[..., -1].mean(axis=-1) - c[..., k].mean(axis=-1))
    low, high = interval(reps)
    word = "plateaued" if low >= -PLATEAU and high <= PLATEAU else "rising" if low > 0 else "undetermined"
    return f"{est:+.3f} {fmt_ci(low, high, sign=True)} since iteration {g.iterations[k]:.0f}: {word}"


def methods_table(an: Analysis, lines: list[str]) -> None:
    """Each method's final score and gain, whether it has plateaued, and its costs."""
    base = an.base
    assert base is not None
    lines += [
        "## Methods on the GenEval reward (test prompts)",
        "",
        f"Base: strict {base['curve'][0]['score']:.3f} on {len(base['curve'][0]['per_prompt'])} prompts. Each "
        "method at its own learning rate (the sweep below); intervals over prompts and seeds. *Last quarter*: "
        f"final minus the point at 3/4 of the horizon; *plateaued* when its interval lies within +-{PLATEAU}.",
        "",
        "| method | lr | seeds | final strict [95% CI] | gain over base [95% CI] | last quarter | collapsed | "
        "s/iteration (rollout / reward / prepare / update) | NFE/iteration | grad steps/iteration | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, g in an.groups.items():
        est, reps = an.statistic([(m, g)], final)
        low, high = interval(reps)
        split = {
            k: float(np.mean([r["time_split_s"][k] for r in g.runs]))
            for k in ("iteration", "rollout", "reward", "prepare", "update")
        }
        nfe = g.axes["nfe"][-1] / g.iterations[-1]
        lines.append(
            f"| {LABELS[m]} | {g.runs[0]['config']['optim']['lr']:g} | {g.seeds} | {est:.3f} {fmt_ci(low, high)} | "
            f"{est_ci(an, [(m, g)], lambda c: final(c) - c[..., 0].mean(axis=-1))} | {plateau(an, m, g)} | "
            f"{sum(collapsed(r, base, COLLAPSE_DROP['geneval']) for r in g.runs)}/{g.seeds} | "
            f"{split['iteration']:.2f} ({split['rollout']:.2f} / {split['reward']:.2f} / {split['prepare']:.2f} / "
            f"{split['update']:.2f}) | {nfe:.0f} | {g.runs[0]['gradient_steps_per_iteration']:.0f} | "
            f"{max(r['peak_rss_mb'] for r in g.runs):.0f} |"
        )
    lines.append("")
    v = an.groups.get("vgrpo")
    if v is None:
        return
    lines += [
        "V-GRPO minus each method at equal iterations, paired on prompts: at the last point and averaged over the "
        "points after the start.",
        "",
        "| V-GRPO minus | final [95% CI] | curve mean [95% CI] |",
        "|---|---|---|",
    ]
    for m, g in an.groups.items():
        if m != "vgrpo":
            pair = [("vgrpo", v), (m, g)]
            lines.append(
                f"| {LABELS[m]} | {est_ci(an, pair, lambda a, b: final(a) - final(b))} | "
                f"{est_ci(an, pair, lambda a, b: curve_mean(a) - curve_mean(b))} |"
            )
    lines.append("")


def cost_ratios(an: Analysis, speed_dir: Path, lines: list[str]) -> None:
    """Each method's seconds per iteration over V-GRPO's: in the grid's own cells (T = 10 sampling steps) and, where
    ``speed_dir`` holds :mod:`benchmarks.speed`'s repeats, at each T they ran (ratio of the medians over repeats)."""
    v = an.groups.get("vgrpo")
    if v is None:
        return
    by_steps: dict[int, dict[str, float]] = {}
    for path in sorted(speed_dir.glob("embedded-T*-r*.json")):
        steps = int(path.stem.split("-T")[1].split("-r")[0])
        by_steps.setdefault(steps, {})
    for steps in by_steps:
        repeats = [json.loads(p.read_text())["results"] for p in sorted(speed_dir.glob(f"embedded-T{steps}-r*.json"))]
        by_steps[steps] = {
            m: statistics.median(r[m]["time/total_s"] for r in repeats) for m in METHODS if all(m in r for r in repeats)
        }
    own = {m: float(np.mean([r["time_split_s"]["iteration"] for r in g.runs])) for m, g in an.groups.items()}
    steps_grid = an.groups["vgrpo"].runs[0]["config"]["rollout"]["num_steps"]
    lines += [
        "Seconds per iteration over V-GRPO's, by the number of sampling steps T: the grid's own cells (T = "
        f"{steps_grid}, mean over seeds) and the clean repeats of [speed.md](speed.md) (ratio of the medians). "
        "Where a method's cost grows with T, a ratio holds only at the T it was measured at.",
        "",
        f"| method | grid cells, T = {steps_grid} | "
        + " | ".join(f"speed.md, T = {t}" for t in sorted(by_steps))
        + " |",
        "|---" * (2 + len(by_steps)) + "|",
    ]
    for m in an.groups:
        if m == "vgrpo":
            continue
        cells_ = [
            f"{by_steps[t][m] / by_steps[t]['vgrpo']:.2f}x"
            if m in by_steps[t] and "vgrpo" in by_steps[t]
            else "not run"
            for t in sorted(by_steps)
        ]
        lines.append(f"| {LABELS[m]} | {own[m] / own['vgrpo']:.2f}x | " + " | ".join(cells_) + " |")
    lines.append("")


def time_to_reward(an: Analysis, lines: list[str]) -> None:
    """Secondary: where V-GRPO's seed-mean curve first reaches each method's final level, as a fraction of that
    method's budget, per replicate (``inf``: not within V-GRPO's budget in that share of replicates)."""
    v = an.groups.get("vgrpo")
    if v is None or len(an.groups) < 2:
        return
    lines += [
        "### Time to reward (secondary)",
        "",
        "Where V-GRPO's mean curve first reaches the other method's *final* level (piecewise linear through the "
        "evaluation points), over that method's budget on the same axis. A ratio jumps to `inf` in a replicate "
        "where V-GRPO never reaches the level, so the paired differences above are the primary statistics.",
        "",
        "| other method | iterations | gradient steps | wall time |",
        "|---|---|---|---|",
    ]
    for m, g in an.groups.items():
        if m == "vgrpo":
            continue
        cells_ = []
        for axis in ("iteration", "gradient_steps", "train_s"):

            def ratio(a: np.ndarray, b: np.ndarray, axis: str = axis, g: Group = g) -> np.ndarray:
                return first_crossing(v.axes[axis], a.mean(axis=-2), final(b)) / g.axes[axis][-1]

            est, reps = an.statistic([("vgrpo", v), (m, g)], ratio)
            low, high = interval(reps)
            cells_.append(f"{fmt(est, 2) if math.isfinite(est) else 'inf'} {fmt_ci(low, high, 2)}")
        lines.append(f"| {LABELS[m]} | " + " | ".join(cells_) + " |")
    lines.append("")


def sweep_table(an: Analysis, sizes: Sizes, lines: list[str]) -> None:
    """Each method's validation score per rung (seed mean, interval over prompts and seeds), the chosen rung in
    bold, and the chosen minus each neighbour (paired on prompts and seeds)."""
    base = an.bases.get("geneval-val")
    scores = sweep_scores(an.records, sizes)
    if not base or not scores:
        return
    lrs = sorted({lr for by_lr in scores.values() for lr in by_lr})
    seeds = range(SWEEP_SEED0, SWEEP_SEED0 + sizes.sweep_seeds)
    lines += [
        "## Learning-rate sweep (validation prompts)",
        "",
        f"Validation strict credit after {sizes.sweep_iterations} iterations, mean of {sizes.sweep_seeds} seeds "
        f"({', '.join(map(str, seeds))}; base {base['curve'][0]['score']:.3f} on "
        f"{len(base['curve'][0]['per_prompt'])} prompts); 95% interval over prompts and seeds. The chosen rung "
        "(highest mean) is in bold; *chosen minus neighbours* pairs the seeds and prompts.",
        "",
        "| method | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | chosen minus neighbours | best interior |",
        "|---" * (len(lrs) + 3) + "|",
    ]
    for m in METHODS:
        by_lr = scores.get(m)
        if not by_lr:
            continue
        key = f"sweep-{m}"  # one seed draw for every rung of a method: rungs are compared seed by seed

        def rung(lr: float, m: str = m) -> Group:
            runs = [
                r
                for r in an.records.values()
                if r["spec"]["phase"] == "sweep"
                and r["spec"]["method"] == m
                and r["spec"]["lr"] == lr
                and r["spec"]["seed"] in seeds
            ]
            return Group(sorted(runs, key=lambda r: r["spec"]["seed"]), base)

        best = best_rate(by_lr)
        row = []
        for lr in lrs:
            if lr not in by_lr:
                row.append("n/a")
                continue
            est, reps = an.statistic([(key, rung(lr))], final, "geneval-val")
            text = f"{est:.3f} {fmt_ci(*interval(reps))}"
            row.append(f"**{text}**" if lr == best else text)
        ordered = sorted(by_lr)
        i = ordered.index(best)
        diffs = [
            f"vs {lr:g}: "
            + est_ci(an, [(key, rung(best)), (key, rung(lr))], lambda a, b: final(a) - final(b), "geneval-val")
            for lr in (ordered[j] for j in (i - 1, i + 1) if 0 <= j < len(ordered))
        ]
        interior = 0 < i < len(ordered) - 1
        lines.append(
            f"| {LABELS[m]} | " + " | ".join(row) + f" | {'; '.join(diffs)} | {'yes' if interior else 'no (edge)'} |"
        )
    lines.append("")


def stability_table(an: Analysis, lines: list[str]) -> None:
    """Each raised-rate cell's worst drop, collapse and spikes, per stage, rate and method."""
    stab = [r for r in an.records.values() if r["spec"]["phase"] == "stability"]
    if not stab:
        return
    lines += [
        "## Stability at raised learning rates",
        "",
        "Fresh seeds, each method at 2x and 4x its own rate (GenEval: the sweep's; preference: the stage's), "
        "evaluated every few iterations. *Worst drop*: the largest fall below the base over the evaluation points "
        "(a diverged cell: the base's whole score), seed mean with its 95% interval over prompts and seeds. "
        "*Collapsed*: a drop beyond the margin at some point, or a divergence. *Spikes*: iterations whose "
        "gradient norm or surrogate magnitude exceeds 10x the median of the cell's first ten.",
        "",
        "| stage | rate | method | lr | seeds | worst drop [95% CI] | per seed | collapsed | grad-norm / surrogate "
        "spikes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for reward in ("geneval", "preference"):
        base = an.bases.get(reward)
        if base is None:
            continue
        variants = sorted({r["spec"]["variant"] for r in stab if r["spec"]["reward"] == reward})
        for x in variants:
            for m in ("vgrpo", "naive_elbo"):
                g = an.group("stability", m, reward=reward, variant=x)
                if g is None:
                    continue
                est, reps = an.seed_statistic([(f"st-{reward}-{x}-{m}", g)], drop_of, identity, reward)
                low, high = interval(reps)
                point, _ = an.weights(reward)
                per = g.worst_drop(g.per_seed(point))
                sp = [spikes(r) for r in g.runs]
                lines.append(
                    f"| {reward} | {x} | {LABELS[m]} | {g.runs[0]['spec']['lr']:g} | {g.seeds} | {est:+.3f} "
                    f"{fmt_ci(low, high, sign=True)} | {', '.join(f'{d:+.3f}' for d in per)} | "
                    f"{sum(collapsed(r, base, COLLAPSE_DROP[reward]) for r in g.runs)}/{g.seeds} | "
                    f"{sum(s['grad_norm'] for s in sp)} / {sum(s['surrogate'] for s in sp)} |"
                )
    lines.append("")


def ablation_table(an: Analysis, lines: list[str]) -> None:
    """Each ablation's seeds against every seed of V-GRPO."""
    v = an.groups.get("vgrpo")
    specs = [r["spec"] for r in an.records.values() if r["spec"]["phase"] == "ablation"]
    variants = sorted({spec["variant"] for spec in specs})
    if v is None or not variants or an.base is None:
        return
    rates = ", ".join(sorted({f"{spec['lr']:g}" for spec in specs}))
    lines += [
        f"## Ablations of V-GRPO (against all {v.seeds} of V-GRPO's seeds)",
        "",
        "Each variant changes one component of V-GRPO's recipe and keeps the rest, its learning rate included "
        f"({rates}, tuned for x-prediction with N_MC 4): a variant that would want another rate is not retuned.",
        "",
        "| variant | seeds | final strict | minus V-GRPO, final [95% CI] | minus V-GRPO, curve mean [95% CI] | worst "
        "drop [95% CI] | collapsed | surrogate CV | within-group CV | s/iteration |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in variants:
        g = an.group("ablation", "vgrpo", variant=x)
        assert g is not None
        pair = [(f"abl-{x}", g), ("vgrpo", v)]
        est, reps = an.seed_statistic([(f"abl-{x}", g)], drop_of, identity)
        low, high = interval(reps)

        def mean_of(key: str, g: Group = g) -> float | None:
            vals = [r[key] for r in g.runs if r.get(key) is not None]
            return float(np.mean(vals)) if vals else None

        lines.append(
            f"| {x} | {g.seeds} | {an.statistic([(f'abl-{x}', g)], final)[0]:.3f} | "
            f"{est_ci(an, pair, lambda a, b: final(a) - final(b))} | "
            f"{est_ci(an, pair, lambda a, b: curve_mean(a) - curve_mean(b))} | {est:+.3f} "
            f"{fmt_ci(low, high, sign=True)} | "
            f"{sum(collapsed(r, an.base, COLLAPSE_DROP['geneval']) for r in g.runs)}/{g.seeds} | "
            f"{fmt(mean_of('surrogate_cv'))} | {fmt(mean_of('surrogate_cv_within_group'))} | "
            f"{np.mean([r['time_split_s']['iteration'] for r in g.runs]):.2f} |"
        )
    lines.append("")


def preference_table(an: Analysis, lines: list[str]) -> None:
    """V-GRPO and naive ELBO-GRPO on the preference stage's rewards at its own rate."""
    groups = {m: an.group("preference", m, reward="preference") for m in ("vgrpo", "naive_elbo")}
    if not any(groups.values()):
        return
    base = an.bases["preference"]
    assert base is not None
    lines += [
        "## The preference stage (world PickScore and CLIPScore)",
        "",
        f"Base: world PickScore {base['curve'][0]['score']:.3f}, CLIPScore {base['curve'][0]['clipscore']:.3f} on "
        f"{len(base['curve'][0]['per_prompt'])} prompts.",
        "",
        "| method | seeds | final PickScore | gain [95% CI] | final CLIPScore (seed mean) |",
        "|---|---|---|---|---|",
    ]
    for m, g in groups.items():
        if g is None:
            continue
        key = f"pref-{'vgrpo' if m == 'vgrpo' else 'naive'}"
        est = an.statistic([(key, g)], final, "preference")[0]
        gain = est_ci(an, [(key, g)], lambda c: final(c) - c[..., 0].mean(axis=-1), "preference")
        clip = float(np.mean([r["curve"][-1]["clipscore"] for r in g.runs if r["curve"]]))
        lines.append(f"| {LABELS[m]} | {g.seeds} | {est:.3f} | {gain} | {clip:.3f} |")
    lines.append("")


def provenance_table(
    records: dict[str, dict[str, Any]], code_now: str | None, config_mismatches: list[str], lines: list[str]
) -> None:
    """Which commits and code the cells ran under, their threads, the cells that ran under load, and the cells
    whose config is not the one this checkout's plan gives their spec."""
    if not records:
        return
    commits = Counter((r.get("git") or {}).get("commit") or "none" for r in records.values())
    codes = Counter(r.get("code_hash", "none") for r in records.values())
    dirty = sorted(n for n, r in records.items() if (r.get("git") or {}).get("code_dirty"))
    threads = Counter(r.get("threads") for r in records.values())
    loaded = sorted(
        (n, r["machine"]["other_load_cores"]) for n, r in records.items() if (r.get("machine") or {}).get("under_load")
    )
    cpu = sum((r.get("machine") or {}).get("process_cpu_s", 0.0) for r in records.values())
    lines += [
        "## Provenance",
        "",
        "Every cell records the commit it ran at, its code hash (the cell's code and its library closure, and the "
        "models: `benchmarks/provenance.py`), the key it resumes by (that and its spec, resolved config, threads and "
        "prompt files), its start time, its process CPU time and the load other processes put on the cores.",
        "",
        f"- Commits: {', '.join(f'{c[:10]} ({n} cells)' for c, n in commits.most_common())}.",
        f"- Code hashes: {', '.join(f'{c} ({n} cells)' for c, n in codes.most_common())}"
        + (f"; this checkout's: {code_now}" if code_now else "")
        + ".",
        f"- Cells whose code differed from their commit: {', '.join(dirty) if dirty else 'none'}.",
        f"- Cells whose config is not the one this checkout's plan gives their spec: "
        f"{', '.join(config_mismatches) if config_mismatches else 'none'}.",
        f"- Torch threads: {', '.join(f'{t} ({n} cells)' for t, n in threads.most_common())}.",
        f"- Process CPU time of all cells: {cpu / 3600:.2f} h.",
        f"- Cells that ran while other processes used more than {LOADED_CORES} cores on average (their wall times "
        "are not comparable; their scores are, as a cell's result does not depend on timing): "
        + (", ".join(f"{n} ({c:.2f})" for n, c in loaded) if loaded else "none")
        + ".",
        "",
    ]


def quick_table(an: Analysis, lines: list[str]) -> None:
    """``--quick``: V-GRPO against naive ELBO-GRPO at each learning rate, final minus final, paired on prompts."""
    if not an.base:
        return
    lines += [
        "## V-GRPO against naive ELBO-GRPO (quick)",
        "",
        f"Base: strict {an.base['curve'][0]['score']:.3f}.",
        "",
        "| lr | V-GRPO final | naive final | V-GRPO minus naive [95% CI] | verdict |",
        "|---|---|---|---|---|",
    ]
    lrs = sorted({r["spec"]["lr"] for r in cells(an.records, "methods")})
    for lr in lrs:
        v = [r for r in cells(an.records, "methods", "vgrpo") if r["spec"]["lr"] == lr]
        n = [r for r in cells(an.records, "methods", "naive_elbo") if r["spec"]["lr"] == lr]
        if not v or not n:
            continue
        gv, gn = Group(v, an.base), Group(n, an.base)
        pair = [(f"q-v-{lr}", gv), (f"q-n-{lr}", gn)]
        est, reps = an.statistic(pair, lambda a, b: final(a) - final(b))
        low, high = interval(reps)
        word = "V-GRPO higher" if low > 0 else "naive higher" if high < 0 else "unresolved"
        lines.append(
            f"| {lr:g} | {an.statistic(pair[:1], final)[0]:.3f} | {an.statistic(pair[1:], final)[0]:.3f} | "
            f"{est:+.3f} {fmt_ci(low, high, sign=True)} | {word} |"
        )
    lines.append("")
