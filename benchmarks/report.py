"""Turn the cells of ``benchmarks/compare.py`` into the benchmark report (markdown, PNG plots) and MLflow runs.

    python benchmarks/report.py runs/bench/full docs/benchmarks [--tracking-uri sqlite:////abs/mlflow.db]

Every number in the report is computed here from the cell records (:mod:`bootstrap` for the intervals); nothing
is typed in by hand. The protocol below is printed at the top of the report with the sizes the cells ran at.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from bootstrap import curve_replicates, first_crossing, interval, point_weights, prompt_weights, verdict
from compare import best_rate

METHODS = ("vgrpo", "naive_elbo", "flow_grpo", "mixgrpo", "diffusion_nft")
LABELS = {
    "vgrpo": "V-GRPO",
    "naive_elbo": "naive ELBO-GRPO",
    "flow_grpo": "Flow-GRPO",
    "mixgrpo": "MixGRPO",
    "diffusion_nft": "DiffusionNFT",
}
AXES = {
    "train_s": "training wall time (s, evaluation excluded)",
    "gradient_steps": "gradient steps",
    "nfe": "transformer evaluations in training (NFE)",
}
N_BOOT = 2000
GAIN_TARGET = 0.15  # the budget should let the best method gain this much held-out GenEval strict
COLLAPSE_DROP = 0.10  # a GenEval cell collapsed when its final strict credit is this far below the base's

PROTOCOL = """\
## Protocol

- **Model and task.** Every cell trains a LoRA (r 32) on `models/embedded-base` on the GenEval stage
  (`params/stages/embedded/2-geneval.yaml`: world GenEval, GenEval's strict verdict as the reward), with the same
  rollout for every method: {prompts} prompts x {group} samples per iteration, {steps} sampling steps, two
  half-batch gradient steps per iteration. Each method adds its own recipe (`params/algorithms/<method>.yaml`).
- **Learning rates.** Each method runs at its own best learning rate, chosen by a sweep over {lrs} ({sweep_it}
  iterations, seed 0; a best rate at an edge is tried one factor 2 further) scored on a *validation* split
  ({val_prompts} GenEval prompts x {eval_group} images drawn from the world's generator with a seed of its own),
  never on the test split.
- **Seeds.** {seeds} training seeds per method; {stab_seeds} for the stability claim (V-GRPO and naive
  ELBO-GRPO at twice V-GRPO's best learning rate, {stab_it} iterations); one seed per ablation (paired with
  V-GRPO's seed-0 cell, so its interval is over prompts only).
- **Evaluation.** Every {every} iterations, and for the base once, the same {test_prompts} held-out test prompts
  (GenEval tags) x {eval_group} images = {images} images, {eval_steps} Euler steps, sampling seed 0 for every
  method; the score is GenEval's strict credit, the mean of its per-tag means.
- **Intervals.** 95% percentile bootstrap ({n_boot} replicates) over prompts (resampled within each tag, the
  same draw for every method, which pairs the comparison) and over each method's seeds. A difference is
  *resolved* only when its interval excludes 0; a target is *met* when its whole interval satisfies it, *missed*
  when none of it does, *unresolved* otherwise.
- **Time to reward.** Read off the piecewise-linear curve through the evaluation points (the base at 0): where
  V-GRPO's mean curve first reaches the other method's best point, divided by where that method reached it; per
  replicate, so the ratio carries an interval (`inf`: not reached within the budget in that share of replicates).
- **Collapse.** A cell collapsed when it diverged (non-finite iterations stopped it) or its final strict credit
  is more than {drop:.2f} below the base's.
- **Wall time.** Seconds of training per iteration as measured in the cells, which ran {workers} at a time with
  {threads} torch thread(s) each, so every method shared the machine the same way; the clean per-iteration costs
  against the number of steps are in [speed.md](speed.md).
"""


QUICK_PROTOCOL = """\
## Protocol (quick)

V-GRPO and naive ELBO-GRPO on the GenEval stage (world GenEval, strict verdict as the reward), {prompts} prompts x
{group} samples per iteration, {iterations} iterations, seed 0, at the stage's learning rate and twice it (no sweep).
Each cell is scored once at the end on the same {test_prompts} held-out test prompts x {eval_group} images =
{images} images as the full grid. The difference carries a 95% bootstrap interval ({n_boot} replicates) over
prompts, resampled within each tag and paired on prompts and images; it is *resolved* when the interval excludes 0.
"""


def load_records(source: Path) -> dict[str, dict[str, Any]]:
    """The cell records of a grid folder (one JSON per cell), or of the ``cells.jsonl`` a report committed."""
    if source.is_file():
        rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
        return {r["name"]: r for r in rows}
    return {p.stem: json.loads(p.read_text()) for p in sorted(source.glob("*.json")) if p.stem != "grid"}


def cells(records: dict[str, dict[str, Any]], phase: str, method: str | None = None, *, reward: str = "geneval",
          variant: str = "default") -> list[dict[str, Any]]:  # fmt: skip
    return sorted(
        (r for r in records.values() if r["spec"]["phase"] == phase and r["spec"]["reward"] == reward
         and r["spec"]["variant"] == variant and (method is None or r["spec"]["method"] == method)),
        key=lambda r: r["spec"]["seed"],
    )  # fmt: skip


def fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def fmt_ci(low: float, high: float, digits: int = 3, sign: bool = False) -> str:
    f = (lambda v: "inf" if math.isinf(v) else f"{v:+.{digits}f}") if sign else (
        lambda v: "inf" if math.isinf(v) else f"{v:.{digits}f}")  # fmt: skip
    return f"[{f(low)}, {f(high)}]"


class Group:
    """One method's seeds: per-prompt scores ``(S, K, P)`` with the base as point 0, and the x axes ``(K,)``."""

    def __init__(self, runs: Sequence[dict[str, Any]], base: dict[str, Any]) -> None:
        self.runs = list(runs)
        b = base["curve"][0]
        self.tags = b["tags"]
        n_points = max(len(r["curve"]) for r in runs)
        scores, axes = [], {a: np.zeros(n_points + 1) for a in AXES}
        for r in runs:
            curve = r["curve"] + [r["curve"][-1]] * (n_points - len(r["curve"]))  # a diverged cell keeps its last
            scores.append([b["per_prompt"]] + [p["per_prompt"] for p in curve])
        full = [r for r in runs if len(r["curve"]) == n_points] or runs
        for a in AXES:
            axes[a][1:] = np.mean([[p[a] for p in r["curve"]] for r in full], axis=0)
        self.scores = np.asarray(scores, dtype=np.float64)
        self.axes = axes
        self.iterations = [0.0] + [p["iteration"] for p in max(runs, key=lambda r: len(r["curve"]))["curve"]]

    def mean_curve(self) -> np.ndarray:
        return self.scores.mean(axis=0) @ point_weights(self.tags)

    def replicates(self, weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return curve_replicates(self.scores, weights, rng)


def collapsed(run: dict[str, Any], base_score: float) -> bool:
    return bool(run.get("diverged")) or not run["curve"] or run["curve"][-1]["score"] < base_score - COLLAPSE_DROP


class Analysis:
    """The shared bootstrap draw and the quantities the report's tables read."""

    def __init__(self, records: dict[str, dict[str, Any]]) -> None:
        self.records = records
        self.base = records.get("base-geneval-test")
        self.rng = np.random.default_rng(0)
        self.weights = prompt_weights(self.base["curve"][0]["tags"], N_BOOT, self.rng) if self.base else None
        self._reps: dict[str, np.ndarray] = {}
        self.groups: dict[str, Group] = {}
        if self.base:
            for m in METHODS:
                runs = cells(records, "methods", m)
                if runs:
                    self.groups[m] = Group(runs, self.base)

    def reps(self, key: str, group: Group) -> np.ndarray:
        if key not in self._reps:
            self._reps[key] = group.replicates(self.weights, self.rng)
        return self._reps[key]

    def final_diff(self, a: tuple[str, Group], b: tuple[str, Group]) -> tuple[float, float, float]:
        """Final point of ``a`` minus final point of ``b`` (same prompts and images): estimate and interval."""
        est = float(a[1].mean_curve()[-1] - b[1].mean_curve()[-1])
        low, high = interval(self.reps(*a)[:, -1] - self.reps(*b)[:, -1])
        return est, low, high

    def time_ratio(self, other: str, axis: str) -> tuple[float, float, float] | None:
        """Where V-GRPO's curve reaches ``other``'s best point over where ``other`` reached it (on ``axis``)."""
        if "vgrpo" not in self.groups or other not in self.groups:
            return None
        v, o = self.groups["vgrpo"], self.groups[other]

        def ratio(vc: np.ndarray, oc: np.ndarray) -> np.ndarray:
            best_k = np.argmax(oc[..., 1:], axis=-1) + 1  # the other method's best trained point
            target = np.take_along_axis(oc, best_k[..., None], axis=-1)[..., 0]
            return first_crossing(v.axes[axis], vc, target) / o.axes[axis][best_k]

        est = float(ratio(v.mean_curve()[None], o.mean_curve()[None])[0])
        low, high = interval(ratio(self.reps("vgrpo", v), self.reps(other, o)))
        return est, low, high


def _cv_ratio(naive: Sequence[dict[str, Any]], ours: Sequence[dict[str, Any]], key: str,
              rng: np.random.Generator) -> tuple[float, float, float, float, float] | None:  # fmt: skip
    """Mean per-iteration CV of each method (over seeds and iterations) and the ratio ours / naive with a
    bootstrap over seeds and, within each drawn seed, its iterations."""
    a = [np.asarray([v for v in r.get(key, []) if v is not None]) for r in naive]
    b = [np.asarray([v for v in r.get(key, []) if v is not None]) for r in ours]
    a, b = [x for x in a if x.size], [x for x in b if x.size]
    if not a or not b:
        return None

    def draw(per_seed: list[np.ndarray]) -> float:
        seeds = [per_seed[i] for i in rng.integers(0, len(per_seed), len(per_seed))]
        return float(np.mean([s[rng.integers(0, s.size, s.size)].mean() for s in seeds]))

    ma, mb = float(np.mean([x.mean() for x in a])), float(np.mean([x.mean() for x in b]))
    low, high = interval(np.asarray([draw(b) / draw(a) for _ in range(N_BOOT)]))
    return ma, mb, mb / ma, low, high


def _fisher(a_hits: int, a_n: int, b_hits: int, b_n: int) -> float:
    from scipy.stats import fisher_exact

    return float(fisher_exact([[a_hits, a_n - a_hits], [b_hits, b_n - b_hits]])[1])


def _plot(analysis: Analysis, axis: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for m, g in analysis.groups.items():
        reps = analysis.reps(m, g)
        low, high = np.quantile(reps, [0.025, 0.975], axis=0)
        ax.plot(g.axes[axis], g.mean_curve(), marker="o", label=f"{LABELS[m]} ({len(g.runs)} seeds)")
        ax.fill_between(g.axes[axis], low, high, alpha=0.15)
    ax.set_xlabel(AXES[axis])
    ax.set_ylabel("held-out GenEval strict")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _claims(an: Analysis, records: dict[str, dict[str, Any]], lines: list[str]) -> list[dict[str, Any]]:
    """The paper's claims, one row each; returns the rows (also the targets' numbers)."""
    rows: list[dict[str, Any]] = []
    base_score = an.base["curve"][0]["score"] if an.base else float("nan")

    def ratio_row(claim: str, paper: str, other: str, axis: str, at_most: float) -> None:
        r = an.time_ratio(other, axis)
        if r is None:
            rows.append({"claim": claim, "paper": paper, "ours": "not run", "verdict": "not run"})
            return
        est, low, high = r
        v = verdict(low, high, at_most=at_most)
        rows.append({"claim": claim, "paper": paper, "ours": f"{fmt(est, 2)} {fmt_ci(low, high, 2)}",
                     "verdict": {"met": "reproduced", "missed": "refuted"}.get(v, v), "target": v,
                     "value": (est, low, high)})  # fmt: skip

    ratio_row(
        "V-GRPO reaches MixGRPO's best held-out reward in at most half its wall time",
        "2x faster than MixGRPO (FLUX: 150 iterations beat its 300): ratio 0.5",
        "mixgrpo",
        "train_s",
        0.5,
    )
    ratio_row(
        "V-GRPO reaches Flow-GRPO's best held-out reward in at most half its wall time",
        "faster than the MDP methods (no number for Flow-GRPO); target ratio 0.5",
        "flow_grpo",
        "train_s",
        0.5,
    )
    ratio_row(
        "V-GRPO reaches DiffusionNFT's best in a third of its gradient steps",
        "580 against about 1.7K steps (SD3.5-M): ratio 0.34",
        "diffusion_nft",
        "gradient_steps",
        1 / 3,
    )

    def diff_row(claim: str, paper: str, a: tuple[str, Group] | None, b: tuple[str, Group] | None,
                 above: float = 0.0, at_most: float | None = None) -> None:  # fmt: skip
        if a is None or b is None:
            rows.append({"claim": claim, "paper": paper, "ours": "not run", "verdict": "not run"})
            return
        est, low, high = an.final_diff(a, b)
        v = verdict(low, high, at_most=at_most) if at_most is not None else verdict(low, high, above=above)
        rows.append({"claim": claim, "paper": paper, "ours": f"{est:+.3f} {fmt_ci(low, high, sign=True)}",
                     "verdict": {"met": "reproduced", "missed": "refuted"}.get(v, v), "target": v,
                     "value": (est, low, high)})  # fmt: skip

    g = an.groups
    diff_row("V-GRPO ends at least as high as naive ELBO-GRPO (final strict, V-GRPO minus naive)",
             "naive ELBO-GRPO is unstable and underperforms", ("vgrpo", g["vgrpo"]) if "vgrpo" in g else None,
             ("naive_elbo", g["naive_elbo"]) if "naive_elbo" in g else None)  # fmt: skip

    stab = {m: cells(records, "stability", m) for m in ("vgrpo", "naive_elbo")}
    if an.base and all(stab.values()):
        hits = {m: sum(collapsed(r, base_score) for r in runs) for m, runs in stab.items()}
        n = {m: len(runs) for m, runs in stab.items()}
        p = _fisher(hits["vgrpo"], n["vgrpo"], hits["naive_elbo"], n["naive_elbo"])
        v = ("reproduced" if hits["vgrpo"] < hits["naive_elbo"] and p < 0.05 else
             "refuted" if hits["vgrpo"] > hits["naive_elbo"] and p < 0.05 else "unresolved")  # fmt: skip
        rows.append({"claim": "V-GRPO collapses in fewer seeds than naive ELBO-GRPO at 2x the learning rate",
                     "paper": "naive ELBO-GRPO collapses; V-GRPO is stable",
                     "ours": f"{hits['vgrpo']}/{n['vgrpo']} against {hits['naive_elbo']}/{n['naive_elbo']} "
                     f"(Fisher exact p = {p:.2f})", "verdict": v,
                     "target": {"reproduced": "met", "refuted": "missed"}.get(v, v)})  # fmt: skip
        sv, sn = Group(stab["vgrpo"], an.base), Group(stab["naive_elbo"], an.base)
        diff_row(
            "... and its final strict credit there (V-GRPO minus naive, 2x learning rate)",
            "",
            ("stab-vgrpo", sv),
            ("stab-naive", sn),
        )
    else:
        rows.append(
            {
                "claim": "V-GRPO collapses in fewer seeds than naive ELBO-GRPO at 2x the learning rate",
                "paper": "naive ELBO-GRPO collapses",
                "ours": "not run",
                "verdict": "not run",
            }
        )

    ref = [r for r in cells(records, "methods", "vgrpo") if r["spec"]["seed"] == 0]
    ref_g = ("abl-ref", Group(ref, an.base)) if ref and an.base else None

    def abl(variant: str) -> tuple[str, Group] | None:
        runs = cells(records, "ablation", "vgrpo", variant=variant)
        return (f"abl-{variant}", Group(runs, an.base)) if runs and an.base else None

    diff_row("N_MC 2 fails to converge (final strict, N_MC 4 minus N_MC 2)", "N_MC 2 fails to converge",
             ref_g, abl("n_mc_2"), above=0.0)  # fmt: skip
    diff_row("N_MC 8 adds little (N_MC 8 minus N_MC 4 below +0.05)", "8 adds little", abl("n_mc_8"), ref_g,
             at_most=0.05)  # fmt: skip
    diff_row("x-prediction beats v-prediction (x minus v)", "x is best, v stable but slower", ref_g,
             abl("v_prediction"))  # fmt: skip
    diff_row("v-prediction beats eps-prediction (v minus eps)", "eps collapses", abl("v_prediction"),
             abl("eps_prediction"))  # fmt: skip
    eps = abl("eps_prediction")
    if eps is not None and an.base:
        drop = eps[1].mean_curve()[-1] - eps[1].mean_curve()[0]
        low, high = interval(an.reps(*eps)[:, -1] - an.reps(*eps)[:, 0])
        v = "reproduced" if high < 0 else "refuted" if low > 0 else "unresolved"
        rows.append({"claim": "eps-prediction collapses (final minus base)", "paper": "eps collapses",
                     "ours": f"{drop:+.3f} {fmt_ci(low, high, sign=True)}", "verdict": v})  # fmt: skip

    naive, ours = cells(records, "methods", "naive_elbo"), cells(records, "methods", "vgrpo")
    for key, label, paper in (("surrogate_cv_per_iteration", "overall", "0.230 -> 0.128 (ratio 0.56)"),
                              ("surrogate_cv_within_group_per_iteration", "within-group",
                               "0.170 -> 0.038 (ratio 0.22)")):  # fmt: skip
        r = _cv_ratio(naive, ours, key, an.rng)
        claim = f"Surrogate CV falls from naive to V-GRPO ({label})"
        if r is None:
            rows.append({"claim": claim, "paper": paper, "ours": "not run", "verdict": "not run"})
            continue
        ma, mb, est, low, high = r
        v = verdict(low, high, at_most=1.0)
        rows.append({"claim": claim, "paper": paper, "verdict": {"met": "reproduced", "missed": "refuted"}.get(v, v),
                     "ours": f"{ma:.3f} -> {mb:.3f} (ratio {est:.2f} {fmt_ci(low, high, 2)})", "target": v,
                     "value": (est, low, high)})  # fmt: skip

    pref_base = records.get("base-preference-test")
    pv, pn = cells(records, "preference", "vgrpo", reward="preference"), cells(
        records, "preference", "naive_elbo", reward="preference")  # fmt: skip
    if pref_base and pv and pn:
        pw = prompt_weights(pref_base["curve"][0]["tags"], N_BOOT, an.rng)
        gv, gn = Group(pv, pref_base), Group(pn, pref_base)
        rv, rn = gv.replicates(pw, an.rng), gn.replicates(pw, an.rng)
        for claim, est, reps_ in (
            ("Preference: V-GRPO raises world PickScore (final minus base)",
             gv.mean_curve()[-1] - gv.mean_curve()[0], rv[:, -1] - rv[:, 0]),
            ("Preference: V-GRPO ends at least as high as naive ELBO-GRPO (PickScore, V-GRPO minus naive)",
             gv.mean_curve()[-1] - gn.mean_curve()[-1], rv[:, -1] - rn[:, -1]),
        ):  # fmt: skip
            low, high = interval(reps_)
            v = verdict(low, high, above=0.0)
            rows.append({"claim": claim, "paper": "V-GRPO improves every preference reward over the base and "
                         "MixGRPO", "ours": f"{est:+.3f} {fmt_ci(low, high, sign=True)}",
                         "verdict": {"met": "reproduced", "missed": "refuted"}.get(v, v)})  # fmt: skip
    else:
        rows.append(
            {
                "claim": "Preference: V-GRPO raises world PickScore and ends at least as high as naive",
                "paper": "V-GRPO improves the preference rewards",
                "ours": "not run",
                "verdict": "not run",
            }
        )

    lines += ["## The paper's claims", "",
              "| claim | paper | ours (estimate [95% CI]) | verdict |", "|---|---|---|---|"]  # fmt: skip
    lines += [f"| {r['claim']} | {r['paper']} | {r['ours']} | {r['verdict']} |" for r in rows]
    lines.append("")
    return rows


def _methods_table(an: Analysis, records: dict[str, dict[str, Any]], lines: list[str]) -> None:
    base_score = an.base["curve"][0]["score"]
    lines += ["## Methods on the GenEval reward (test split)", "",
              f"Base: strict {base_score:.3f} (partial {an.base['curve'][0]['partial']:.3f}) on "
              f"{len(an.base['curve'][0]['per_prompt'])} prompts x {_images_per_prompt(records)} images.", "",
              "| method | lr | seeds | final strict [95% CI] | gain over base [95% CI] | best point | collapsed | "
              "s/iteration (rollout / reward / prepare / update) | NFE/iteration | grad steps/iteration | "
              "peak RSS MB |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for m, g in an.groups.items():
        reps = an.reps(m, g)
        curve = g.mean_curve()
        flow, fhigh = interval(reps[:, -1])
        glow, ghigh = interval(reps[:, -1] - reps[:, 0])
        best = int(np.argmax(curve))
        split = {k: float(np.mean([r["time_split_s"][k] for r in g.runs])) for k in
                 ("iteration", "rollout", "reward", "prepare", "update")}  # fmt: skip
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
    lines += ["", f"Budget check: the largest gain, {LABELS[top]}'s {gains[top]:+.3f} {fmt_ci(low, high, sign=True)}, "
              f"against the protocol's +{GAIN_TARGET:.2f} for the best method: {word}.", ""]  # fmt: skip
    if "vgrpo" not in an.groups:
        return
    v = an.groups["vgrpo"]
    lines += ["V-GRPO minus each method, paired on prompts and images: at the last point, and averaged over the "
              "evaluation points after the start (the curve's mean height at equal iterations, less noisy than one "
              "point).", "", "| V-GRPO minus | final [95% CI] | | curve mean [95% CI] | |",
              "|---|---|---|---|---|"]  # fmt: skip
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


def _images_per_prompt(records: dict[str, dict[str, Any]]) -> int:
    cfg = next((r["config"] for r in records.values() if "config" in r), None)
    return int(cfg["evaluation"]["group_size"]) if cfg else 4


def _sweep_table(records: dict[str, dict[str, Any]], lines: list[str]) -> None:
    sweep = cells(records, "sweep")
    base = records.get("base-geneval-val")
    if not sweep or not base:
        return
    lrs = sorted({r["spec"]["lr"] for r in sweep})
    lines += ["## Learning-rate sweep (validation split)", "",
              f"Validation strict credit after {sweep[0]['spec']['iterations']} iterations (seed 0; base "
              f"{base['curve'][0]['score']:.3f}); 95% CI over prompts. The chosen rate is in bold.", "",
              "| method | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |", "|---" * (len(lrs) + 1) + "|"]  # fmt: skip
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


def _stability_and_ablations(an: Analysis, records: dict[str, dict[str, Any]], lines: list[str]) -> None:
    base_score = an.base["curve"][0]["score"]
    stab = [r for m in ("vgrpo", "naive_elbo") for r in cells(records, "stability", m)]
    if stab:
        lines += ["## Stability at twice V-GRPO's learning rate", "",
                  f"lr {stab[0]['config']['optim']['lr']:g}, {stab[0]['spec']['iterations']} iterations; final "
                  "held-out strict per seed (collapsed cells marked x).", "",
                  "| method | per seed | collapsed |", "|---|---|---|"]  # fmt: skip
        for m in ("vgrpo", "naive_elbo"):
            runs = cells(records, "stability", m)
            per = ", ".join(f"{r['curve'][-1]['score']:.3f}" + (" x" if collapsed(r, base_score) else "")
                            if r["curve"] else "diverged" for r in runs)  # fmt: skip
            lines.append(f"| {LABELS[m]} | {per} | {sum(collapsed(r, base_score) for r in runs)}/{len(runs)} |")
        lines.append("")
    abl = [r for r in records.values() if r["spec"]["phase"] == "ablation"]
    ref = [r for r in cells(records, "methods", "vgrpo") if r["spec"]["seed"] == 0]
    if abl and ref:
        lines += ["## Ablations of V-GRPO (seed 0, paired with V-GRPO's seed-0 cell)", "",
                  "| variant | final strict | minus V-GRPO [95% CI over prompts] | collapsed | surrogate CV | "
                  "within-group CV | s/iteration |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        rg = ("abl-ref", Group(ref, an.base))
        for r in [ref[0], *sorted(abl, key=lambda r: r["spec"]["variant"])]:
            name = "reference (N_MC 4, x)" if r is ref[0] else r["spec"]["variant"]
            g = (f"abl-{r['spec']['variant']}", Group([r], an.base)) if r is not ref[0] else rg
            est, low, high = an.final_diff(g, rg)
            lines.append(f"| {name} | {g[1].mean_curve()[-1]:.3f} | {est:+.3f} {fmt_ci(low, high, sign=True)} | "
                         f"{'yes' if collapsed(r, base_score) else 'no'} | {fmt(r['surrogate_cv'])} | "
                         f"{fmt(r['surrogate_cv_within_group'])} | {r['time_split_s']['iteration']:.1f} |")  # fmt: skip
        lines.append("")


def _machine_share(out: Path) -> dict[str, Any]:
    """How the cells shared the machine, as the grid's last recorded invocation ran them (grid.json)."""
    path = (out.parent if out.is_file() else out) / "grid.json"
    last = json.loads(path.read_text())[-1] if path.is_file() else {}
    return {"workers": last.get("workers", "n/a"), "threads": last.get("threads", "n/a")}


def _grid_time(out: Path, records: dict[str, dict[str, Any]]) -> tuple[float, float]:
    """Elapsed seconds of the grid's invocations (grid.json) and the cells' summed wall time."""
    path = (out.parent if out.is_file() else out) / "grid.json"
    elapsed = sum(float(x["elapsed_s"]) for x in json.loads(path.read_text())) if path.is_file() else float("nan")
    return elapsed, sum(float(r.get("wall_s", 0.0)) for r in records.values())


def write_report(out: Path, docs: Path, *, command: str, planned: Sequence[str], quick: bool = False,
                 tracking_uri: str | None = None, sizes: Any = None) -> None:  # fmt: skip
    """Write ``docs/README.md`` and the plots from the cell records in ``out`` (and the MLflow runs)."""
    records = load_records(out)
    docs.mkdir(parents=True, exist_ok=True)
    folder = "docs/benchmarks-quick" if quick else "docs/benchmarks"
    an = Analysis(records)
    lines = ["# Benchmarks: V-GRPO and the baselines on the embedded default", "",
             f"Produced by `{command}`; the report alone, from the committed records: `python benchmarks/report.py "
             f"{folder}/cells.jsonl {folder}{' --quick' if quick else ''}`. "
             "Machine: 2 CPU cores, no GPU.", ""]  # fmt: skip
    if sizes is not None and quick:
        lines.append(QUICK_PROTOCOL.format(
            prompts=sizes.prompts, group=sizes.group, iterations=sizes.iterations, test_prompts=sizes.test_prompts,
            eval_group=sizes.eval_group, images=sizes.test_prompts * sizes.eval_group, n_boot=N_BOOT))  # fmt: skip
    elif sizes is not None:
        from compare import SWEEP_LRS

        lines.append(PROTOCOL.format(
            prompts=sizes.prompts, group=sizes.group, steps=10, lrs=", ".join(f"{x:g}" for x in SWEEP_LRS),
            sweep_it=sizes.sweep_iterations, val_prompts=sizes.val_prompts, eval_group=sizes.eval_group,
            seeds=sizes.seeds, stab_seeds=sizes.stability_seeds, stab_it=sizes.stability_iterations,
            every=sizes.eval_every, test_prompts=sizes.test_prompts, images=sizes.test_prompts * sizes.eval_group,
            eval_steps=sizes.eval_steps, n_boot=N_BOOT, drop=COLLAPSE_DROP, **_machine_share(out)))  # fmt: skip
    done = [n for n in planned if n in records]
    missing = [n for n in planned if n not in records]
    elapsed, cell_s = _grid_time(out, records)
    lines += [f"Cells done: {len(done)} of {len(planned)}; the invocations recorded in grid.json took "
              f"{elapsed / 60:.1f} min; the cells' own wall time (model loading, training, evaluations) sums to "
              f"{cell_s / 60:.1f} min.", ""]  # fmt: skip
    if missing:
        lines += [f"Not run yet ({len(missing)}; the command resumes the grid): {', '.join(missing)}", ""]
    rows: list[dict[str, Any]] = []
    if an.base and an.groups and not quick:
        rows = _claims(an, records, lines)
        _methods_table(an, records, lines)
        for axis in AXES:
            _plot(an, axis, docs / f"geneval-vs-{axis}.png", f"held-out GenEval strict vs {AXES[axis].split(' (')[0]}")
            lines += [f"![GenEval vs {axis}](geneval-vs-{axis}.png)", ""]
        lines += ["Bands: each method's own 95% interval over prompts and seeds at each evaluation point; they include "
                  "the prompts' shared difficulty, which the paired differences above remove.", ""]  # fmt: skip
        _stability_and_ablations(an, records, lines)
    _sweep_table(records, lines)
    if quick:
        _quick_table(an, records, lines)
    (docs / "README.md").write_text("\n".join(lines) + "\n")
    # The records themselves (the report's only input), so that the numbers can be recomputed from the repository.
    if out.is_dir() and (out / "grid.json").is_file():
        (docs / "grid.json").write_text((out / "grid.json").read_text())
    (docs / "cells.jsonl").write_text("".join(json.dumps(records[k], sort_keys=True) + "\n" for k in sorted(records)))
    if tracking_uri:
        track(records, tracking_uri, grid="quick" if quick else "full", claims=rows)


def _quick_table(an: Analysis, records: dict[str, dict[str, Any]], lines: list[str]) -> None:
    """``--quick``: V-GRPO against naive ELBO-GRPO at each learning rate, final minus final, paired."""
    if not an.base:
        return
    lines += ["## V-GRPO against naive ELBO-GRPO (quick)", "", f"Base: strict {an.base['curve'][0]['score']:.3f}.", "",
              "| lr | V-GRPO final | naive final | V-GRPO minus naive [95% CI] | verdict |",
              "|---|---|---|---|---|"]  # fmt: skip
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
        lines.append(f"| {lr:g} | {gv[1].mean_curve()[-1]:.3f} | {gn[1].mean_curve()[-1]:.3f} | {est:+.3f} "
                     f"{fmt_ci(low, high, sign=True)} | {word} |")  # fmt: skip
    lines.append("")


def track(records: dict[str, dict[str, Any]], tracking_uri: str, *, grid: str,
          claims: Sequence[dict[str, Any]] = ()) -> None:  # fmt: skip
    """One MLflow run per cell under one parent run of the grid: the spec as params (the columns to compare),
    the held-out curve as a metric history (step = iteration), the costs as metrics. Idempotent: a cell already
    logged (tag ``bench.cell``) is skipped, so a resumed grid adds only its new cells."""
    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    name = "vgrpo-benchmarks"
    exp = client.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp else client.create_experiment(name)
    parents = client.search_runs([exp_id], f"tags.`bench.grid` = '{grid}' and tags.`bench.role` = 'parent'")
    parent = parents[0].info.run_id if parents else client.create_run(
        exp_id, run_name=f"bench-{grid}", tags={"bench.grid": grid, "bench.role": "parent"}).info.run_id  # fmt: skip
    logged = {r.data.tags.get("bench.cell") for r in client.search_runs(
        [exp_id], f"tags.`bench.grid` = '{grid}' and tags.`bench.role` = 'cell'", max_results=5000)}  # fmt: skip
    for cell, rec in records.items():
        if cell in logged:
            continue
        spec = rec["spec"]
        run = client.create_run(exp_id, run_name=cell, tags={
            "bench.grid": grid, "bench.role": "cell", "bench.cell": cell, "mlflow.parentRunId": parent})  # fmt: skip
        rid = run.info.run_id
        params = {k: str(v) for k, v in spec.items() if k != "overrides"}
        params["overrides"] = json.dumps(spec.get("overrides", {}), sort_keys=True)
        metrics: list[Any] = []
        for p in rec["curve"]:
            step = int(p["iteration"])
            for key in ("score", "partial", "clipscore", "train_s", "gradient_steps", "nfe"):
                if key in p:
                    metrics.append(mlflow.entities.Metric(f"heldout/{key}", float(p[key]), 0, step))
        for key in ("surrogate_cv", "surrogate_cv_within_group", "peak_rss_mb", "wall_s"):
            if rec.get(key) is not None:
                metrics.append(mlflow.entities.Metric(key, float(rec[key]), 0, 0))
        for key, v in (rec.get("time_split_s") or {}).items():
            if v is not None:
                metrics.append(mlflow.entities.Metric(f"time/{key}_s", float(v), 0, 0))
        client.log_batch(rid, metrics=metrics, params=[mlflow.entities.Param(k, v) for k, v in params.items()])
        client.set_terminated(rid, "FAILED" if rec.get("diverged") else "FINISHED")
    for i, row in enumerate(claims):  # the claims table on the parent, so the grid reads at the top level
        if "value" in row:
            est, low, high = row["value"]
            for suffix, v in (("", est), ("_low", low), ("_high", high)):
                if math.isfinite(v):
                    client.log_metric(parent, f"claim{i:02d}{suffix}", float(v))
            client.set_tag(parent, f"claim{i:02d}", f"{row['claim']}: {row['verdict']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the cells' folder (runs/bench/full) or a report's cells.jsonl")
    parser.add_argument("docs", type=Path, help="report folder")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    from compare import QUICK, Sizes

    records = load_records(args.out)
    write_report(args.out, args.docs, command="python benchmarks/compare.py" + (" --quick" if args.quick else ""),
                 planned=list(records), quick=args.quick, tracking_uri=args.tracking_uri,
                 sizes=QUICK if args.quick else Sizes())  # fmt: skip


if __name__ == "__main__":
    main()
