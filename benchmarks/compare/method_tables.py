"""The report's tables on the methods at their own rates: each method's final score and gain (with whether it has
plateaued) and costs, V-GRPO paired against each, the cost per iteration against the number of sampling steps, and
time to reward; and the number formats every table of the report uses."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import LABELS, METHODS
from benchmarks.compare.analysis import Analysis, Group, curve_mean, final
from benchmarks.compare.bootstrap import first_crossing, interval
from benchmarks.compare.collapse import COLLAPSE_DROP, collapsed

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
    repeats_note = " and the clean repeats of [speed.md](speed.md) (ratio of the medians)" if by_steps else ""
    lines += [
        "Seconds per iteration over V-GRPO's, by the number of sampling steps T: the grid's own cells (T = "
        f"{steps_grid}, mean over seeds){repeats_note}. "
        "Where a method's cost grows with T, a ratio holds only at the T it was measured at.",
        "",
        f"| method | grid cells, T = {steps_grid} |" + "".join(f" speed.md, T = {t} |" for t in sorted(by_steps)),
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
        lines.append(f"| {LABELS[m]} | {own[m] / own['vgrpo']:.2f}x |" + "".join(f" {c} |" for c in cells_))
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
