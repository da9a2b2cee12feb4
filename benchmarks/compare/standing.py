"""How the methods stand against each other on this world, beside how the papers order them.

The papers' differences come from their reported results, each method at its own (unequal) budget, on the real
models (V-GRPO, arXiv 2604.23380: SD3.5-Medium after its curriculum, GenEval; FLUX.1-dev after 300 iterations,
HPSv2.1). Here every method runs the same iterations on the embedded default, so an order that differs says
where this world (or the equal budget) disagrees with the papers, not that either is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmarks.common import LABELS
from benchmarks.compare.analysis import Analysis, final
from benchmarks.compare.collapse import COLLAPSE_DROP, collapsed
from benchmarks.compare.method_tables import fmt_ci
from benchmarks.compare.studentized import t_test
from benchmarks.compare.verdicts import Row, fill


@dataclass(frozen=True)
class PaperPair:
    """The papers' difference ``first`` minus ``second`` and where it was reported."""

    first: str
    second: str
    difference: float
    reported: str


PAPER_PAIRS = (
    PaperPair("flow_grpo", "vgrpo", 0.95 - 0.91, "SD3.5-M GenEval 0.95 vs 0.91"),
    PaperPair("diffusion_nft", "vgrpo", 0.94 - 0.91, "SD3.5-M GenEval 0.94 vs 0.91; about 1.7K vs 580 updates"),
    PaperPair("flow_grpo", "diffusion_nft", 0.95 - 0.94, "SD3.5-M GenEval 0.95 vs 0.94"),
    PaperPair(
        "vgrpo", "mixgrpo", 0.372 - 0.367, "FLUX.1-dev HPSv2.1 0.372 vs 0.367; ahead on its three other rewards too"
    ),
)


def order_here(paper_difference: float, low: float, high: float) -> str:
    """Whether this grid's interval ``[low, high]`` for the same difference orders the pair as the paper does."""
    if low > 0 or high < 0:
        return "as the papers" if (low > 0) == (paper_difference > 0) else "reversed"
    return "unresolved (the interval holds 0)"


def _difference(an: Analysis, pair: PaperPair) -> tuple[float, float, float]:
    """``pair.first``'s final minus ``pair.second``'s and its 95% interval: the hull of the bootstrap's percentile
    interval and the t interval over seeds (:func:`benchmarks.compare.studentized.t_test`), which the percentile
    interval understates at a few seeds."""
    groups = [(pair.first, an.groups[pair.first]), (pair.second, an.groups[pair.second])]

    def fn(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return final(a) - final(b)

    est, reps = an.statistic(groups, fn)
    assert an.base is not None
    tt = t_test(an.design(groups, fn), an.weights("geneval")[0], an.base["curve"][0]["tags"], 0.0)
    row = fill(Row(f"{pair.first} - {pair.second}", "", "", ""), est, reps, tt)  # the claims' interval
    return est, row.low, row.high


def standing_lines(an: Analysis, where: str) -> list[str]:
    """A table of :data:`PAPER_PAIRS` with this grid's final difference (paired on prompts, intervals over prompts
    and seeds, from ``an``'s methods cells; ``where`` names the prompts and horizon) and a line on naive
    ELBO-GRPO's collapses, which the V-GRPO paper reports and no score difference shows."""
    groups = an.groups
    pairs = [p for p in PAPER_PAIRS if p.first in groups and p.second in groups]
    if not pairs:
        return []
    lines = [
        "## Standing against the papers",
        "",
        "The papers report each method at its own budget on the real models; here every method ran the same "
        f"iterations on the embedded default ({where}). First minus second, paired on prompts, final GenEval strict "
        "with its 95% interval over prompts and seeds (the hull of the percentile and t intervals, as the claims').",
        "",
        "| first minus second | the papers | here [95% CI] | order here |",
        "|---|---|---|---|",
    ]
    for p in pairs:
        est, low, high = _difference(an, p)
        lines.append(
            f"| {LABELS[p.first]} minus {LABELS[p.second]} | {p.difference:+.3f} ({p.reported}) | "
            f"{est:+.3f} {fmt_ci(low, high, sign=True)} | {order_here(p.difference, low, high)} |"
        )
    lines.append("")
    naive = groups.get("naive_elbo")
    if naive is not None and an.base is not None:
        fell = sum(collapsed(r, an.base, COLLAPSE_DROP["geneval"]) for r in naive.runs)
        lines += [
            "The V-GRPO paper finds naive ELBO-GRPO severely unstable (its FLUX.1-dev ablation). Here, at its own "
            f"rate, {fell} of its {naive.seeds} cells collapsed (a drop of more than {COLLAPSE_DROP['geneval']:g} "
            "below the base, or a divergence); the stress rows (S1, S2) test it at raised rates.",
            "",
        ]
    return lines
