"""The report's tables on the other phases and the records: the learning-rate sweep, stability at raised rates,
the ablations, the preference stage, the quick grid, and the records' provenance."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from benchmarks.common import LABELS, METHODS
from benchmarks.compare.analysis import Analysis, Group, cells, curve_mean, drop_of, final, identity
from benchmarks.compare.bootstrap import interval
from benchmarks.compare.collapse import COLLAPSE_DROP, collapsed, spikes
from benchmarks.compare.method_tables import est_ci, fmt, fmt_ci
from benchmarks.compare.plan import SWEEP_SEED0, Sizes, best_rate, sweep_scores
from benchmarks.provenance import LOADED_CORES


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
