"""The report's tables in markdown: the methods on the GenEval reward with the budget check and V-GRPO's paired
differences, the learning-rate sweep, stability and the ablations, and the quick grid's comparison."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from benchmarks.analysis import N_BOOT, Analysis, Group, cells, collapsed
from benchmarks.bootstrap import interval, point_weights, prompt_weights, verdict
from benchmarks.common import LABELS, METHODS
from benchmarks.grid import best_rate

GAIN_TARGET = 0.15  # the budget should let the best method gain this much held-out GenEval strict


def fmt(x: float | None, digits: int = 3) -> str:
    """``x`` to ``digits`` decimals, ``n/a`` when missing."""
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def fmt_ci(low: float, high: float, digits: int = 3, sign: bool = False) -> str:
    """An interval as ``[low, high]`` (``inf`` where a target was never reached)."""
    f = (
        (lambda v: "inf" if math.isinf(v) else f"{v:+.{digits}f}")
        if sign
        else (lambda v: "inf" if math.isinf(v) else f"{v:.{digits}f}")
    )
    return f"[{f(low)}, {f(high)}]"


def methods_table(an: Analysis, records: dict[str, dict[str, Any]], lines: list[str]) -> None:
    """Each method's final and gain over the base, costs, the budget check and V-GRPO minus each method."""
    base_score = an.base["curve"][0]["score"]
    lines += [
        "## Methods on the GenEval reward (test split)",
        "",
        f"Base: strict {base_score:.3f} (partial {an.base['curve'][0]['partial']:.3f}) on "
        f"{len(an.base['curve'][0]['per_prompt'])} prompts x {images_per_prompt(records)} images.",
        "",
        "| method | lr | seeds | final strict [95% CI] | gain over base [95% CI] | best point | collapsed | "
        "s/iteration (rollout / reward / prepare / update) | NFE/iteration | grad steps/iteration | "
        "peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, g in an.groups.items():
        reps = an.reps(m, g)
        curve = g.mean_curve()
        flow, fhigh = interval(reps[:, -1])
        glow, ghigh = interval(reps[:, -1] - reps[:, 0])
        best = int(np.argmax(curve))
        split = {
            k: float(np.mean([r["time_split_s"][k] for r in g.runs]))
            for k in ("iteration", "rollout", "reward", "prepare", "update")
        }
        nfe = g.axes["nfe"][-1] / g.iterations[-1]
        lines.append(
            f"| {LABELS[m]} | {g.runs[0]['config']['optim']['lr']:g} | {len(g.runs)} | {curve[-1]:.3f} "
            f"{fmt_ci(flow, fhigh)} | {curve[-1] - curve[0]:+.3f} {fmt_ci(glow, ghigh, sign=True)} | "
            f"{curve[best]:.3f} (it {g.iterations[best]:.0f}) | "
            f"{sum(collapsed(r, base_score) for r in g.runs)}/{len(g.runs)} | {split['iteration']:.1f} "
            f"({split['rollout']:.1f} / {split['reward']:.1f} / {split['prepare']:.1f} / {split['update']:.1f}) | "
            f"{nfe:.0f} | {g.runs[0]['gradient_steps_per_iteration']:.0f} | "
            f"{max(r['peak_rss_mb'] for r in g.runs):.0f} |"
        )
    gains = {m: float(g.mean_curve()[-1] - g.mean_curve()[0]) for m, g in an.groups.items()}
    top = max(gains, key=lambda m: gains[m])
    reps = an.reps(top, an.groups[top])
    low, high = interval(reps[:, -1] - reps[:, 0])
    word = {"met": "met", "missed": "missed"}.get(verdict(low, high, above=GAIN_TARGET - 1e-12), "unresolved")
    lines += [
        "",
        f"Budget check: the largest gain, {LABELS[top]}'s {gains[top]:+.3f} {fmt_ci(low, high, sign=True)}, "
        f"against the protocol's +{GAIN_TARGET:.2f} for the best method: {word}.",
        "",
    ]
    if "vgrpo" not in an.groups:
        return
    v = an.groups["vgrpo"]
    lines += [
        "V-GRPO minus each method, paired on prompts and images: at the last point, and averaged over the "
        "evaluation points after the start (the curve's mean height at equal iterations, less noisy than one "
        "point).",
        "",
        "| V-GRPO minus | final [95% CI] | | curve mean [95% CI] | |",
        "|---|---|---|---|---|",
    ]
    for m, g in an.groups.items():
        if m == "vgrpo":
            continue
        d_reps = an.reps("vgrpo", v) - an.reps(m, g)
        d = v.mean_curve() - g.mean_curve()
        cells_ = []
        for est, rep in ((d[-1], d_reps[:, -1]), (d[1:].mean(), d_reps[:, 1:].mean(axis=1))):
            low, high = interval(rep)
            word = {"met": "V-GRPO higher", "missed": "V-GRPO lower"}.get(verdict(low, high, above=0.0), "unresolved")
            cells_ += [f"{est:+.3f} {fmt_ci(low, high, sign=True)}", word]
        lines.append(f"| {LABELS[m]} | " + " | ".join(cells_) + " |")
    lines.append("")


def images_per_prompt(records: dict[str, dict[str, Any]]) -> int:
    cfg = next((r["config"] for r in records.values() if "config" in r), None)
    return int(cfg["evaluation"]["group_size"]) if cfg else 4


def sweep_table(records: dict[str, dict[str, Any]], lines: list[str]) -> None:
    """Each method's validation score at each learning rate tried, the chosen rate in bold."""
    sweep = cells(records, "sweep")
    base = records.get("base-geneval-val")
    if not sweep or not base:
        return
    lrs = sorted({r["spec"]["lr"] for r in sweep})
    lines += [
        "## Learning-rate sweep (validation split)",
        "",
        f"Validation strict credit after {sweep[0]['spec']['iterations']} iterations (seed 0; base "
        f"{base['curve'][0]['score']:.3f}); 95% CI over prompts. The chosen rate is in bold.",
        "",
        "| method | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |",
        "|---" * (len(lrs) + 1) + "|",
    ]
    w = point_weights(base["curve"][0]["tags"])
    rng = np.random.default_rng(1)
    pw = prompt_weights(base["curve"][0]["tags"], N_BOOT, rng)
    for m in METHODS:
        runs = {r["spec"]["lr"]: r for r in sweep if r["spec"]["method"] == m}
        if not runs:
            continue
        best = best_rate({lr: r["curve"][-1]["score"] if r["curve"] else float("-inf") for lr, r in runs.items()})
        row = []
        for lr in lrs:
            if lr not in runs or not runs[lr]["curve"]:
                row.append("n/a")
                continue
            x = np.asarray(runs[lr]["curve"][-1]["per_prompt"])
            low, high = interval(pw @ x)
            text = f"{float(w @ x):.3f} {fmt_ci(low, high)}"
            row.append(f"**{text}**" if lr == best else text)
        lines.append(f"| {LABELS[m]} | " + " | ".join(row) + " |")
    lines.append("")


def stability_and_ablations(an: Analysis, records: dict[str, dict[str, Any]], lines: list[str]) -> None:
    """The stability cells per seed, and each ablation against V-GRPO's seed-0 cell."""
    base_score = an.base["curve"][0]["score"]
    stab = [r for m in ("vgrpo", "naive_elbo") for r in cells(records, "stability", m)]
    if stab:
        lines += [
            "## Stability at twice V-GRPO's learning rate",
            "",
            f"lr {stab[0]['config']['optim']['lr']:g}, {stab[0]['spec']['iterations']} iterations; final "
            "held-out strict per seed (collapsed cells marked x).",
            "",
            "| method | per seed | collapsed |",
            "|---|---|---|",
        ]
        for m in ("vgrpo", "naive_elbo"):
            runs = cells(records, "stability", m)
            per = ", ".join(
                f"{r['curve'][-1]['score']:.3f}" + (" x" if collapsed(r, base_score) else "")
                if r["curve"]
                else "diverged"
                for r in runs
            )
            lines.append(f"| {LABELS[m]} | {per} | {sum(collapsed(r, base_score) for r in runs)}/{len(runs)} |")
        lines.append("")
    abl = [r for r in records.values() if r["spec"]["phase"] == "ablation"]
    ref = [r for r in cells(records, "methods", "vgrpo") if r["spec"]["seed"] == 0]
    if abl and ref:
        lines += [
            "## Ablations of V-GRPO (seed 0, paired with V-GRPO's seed-0 cell)",
            "",
            "| variant | final strict | minus V-GRPO [95% CI over prompts] | collapsed | surrogate CV | "
            "within-group CV | s/iteration |",
            "|---|---|---|---|---|---|---|",
        ]
        rg = ("abl-ref", Group(ref, an.base))
        for r in [ref[0], *sorted(abl, key=lambda r: r["spec"]["variant"])]:
            name = "reference (N_MC 4, x)" if r is ref[0] else r["spec"]["variant"]
            g = (f"abl-{r['spec']['variant']}", Group([r], an.base)) if r is not ref[0] else rg
            est, low, high = an.final_diff(g, rg)
            lines.append(
                f"| {name} | {g[1].mean_curve()[-1]:.3f} | {est:+.3f} {fmt_ci(low, high, sign=True)} | "
                f"{'yes' if collapsed(r, base_score) else 'no'} | {fmt(r['surrogate_cv'])} | "
                f"{fmt(r['surrogate_cv_within_group'])} | {r['time_split_s']['iteration']:.1f} |"
            )
        lines.append("")


def quick_table(an: Analysis, records: dict[str, dict[str, Any]], lines: list[str]) -> None:
    """``--quick``: V-GRPO against naive ELBO-GRPO at each learning rate, final minus final, paired."""
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
    lrs = sorted({r["spec"]["lr"] for r in cells(records, "methods")})
    for lr in lrs:
        v = [r for r in cells(records, "methods", "vgrpo") if r["spec"]["lr"] == lr]
        n = [r for r in cells(records, "methods", "naive_elbo") if r["spec"]["lr"] == lr]
        if not v or not n:
            continue
        gv, gn = (f"q-v-{lr}", Group(v, an.base)), (f"q-n-{lr}", Group(n, an.base))
        est, low, high = an.final_diff(gv, gn)
        res = verdict(low, high, above=0.0)
        word = {"met": "V-GRPO higher (resolved)", "missed": "naive higher (resolved)"}.get(res, "unresolved")
        lines.append(
            f"| {lr:g} | {gv[1].mean_curve()[-1]:.3f} | {gn[1].mean_curve()[-1]:.3f} | {est:+.3f} "
            f"{fmt_ci(low, high, sign=True)} | {word} |"
        )
    lines.append("")
