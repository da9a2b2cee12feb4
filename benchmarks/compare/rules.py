"""What a claim's rule is made of: the groups of cells it compares, the statistic it reads off their curves, the
notes it adds, and the :class:`Claim` that puts them together with the claim's words, threshold and side.

The claims themselves are a table of these (:data:`benchmarks.compare.claims.CLAIMS`);
:func:`benchmarks.compare.claim_rows.read` reads one off the records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from benchmarks.common import LABELS
from benchmarks.compare.analysis import Analysis, Group, at_budget, curve_mean, final, identity, start
from benchmarks.compare.collapse import COLLAPSE_DROP, collapsed, fisher_p, seeds_for_power
from benchmarks.compare.method_tables import plateau

Groups = list[tuple[str, Group | None]]
"""A claim's groups as the statistic takes them: each with the key its seed draw is shared under."""

SHORT = {"vgrpo": "vgrpo", "naive_elbo": "naive"}
"""The two methods' names in the stability and preference cells' draw keys."""


@dataclass(frozen=True)
class Cells:
    """One group of a claim: the cells of a phase for one method, reward and variant (all their seeds)."""

    phase: str
    method: str
    reward: str = "geneval"
    variant: str = "default"

    @property
    def key(self) -> str:
        """The name the group's seed draw is shared under (:meth:`Analysis.seed_draw`): every row that compares
        these cells resamples the same seeds, so the draws are those the grid's rules were first run with."""
        if self.phase == "methods":
            return self.method
        if self.phase == "ablation":
            return f"abl-{self.variant}"
        if self.phase == "preference":
            return f"pref-{SHORT[self.method]}"
        return f"stab-{self.reward}-{SHORT[self.method]}-{self.variant}"


@dataclass(frozen=True)
class RaisedRates:
    """The stability cells of ``reward`` at every raised rate both methods have run at: the groups naive ELBO-GRPO,
    V-GRPO, naive ELBO-GRPO, V-GRPO, ... rate by rate. A claim over them may name the rates in its words as
    ``{rates}`` (``x2 and x4``) and ``{rate_list}`` (``x2, x4``)."""

    reward: str


@dataclass(frozen=True)
class Curves:
    """A statistic linear in the groups' per-seed curves ``(..., S, K)``: ``of(*curves)``, each reduced over seeds
    by ``of`` itself (:func:`benchmarks.compare.analysis.final`)."""

    of: Callable[..., np.ndarray]

    def function(self, groups: list[Group]) -> Callable[..., np.ndarray]:
        return self.of


@dataclass(frozen=True)
class AtBudget:
    """The first group (V-GRPO) read at ``fraction`` of the second's budget on ``axis``, minus the second at its
    full budget: the paper's speed claims."""

    axis: str
    fraction: float

    def function(self, groups: list[Group]) -> Callable[..., np.ndarray]:
        xs, x = groups[0].axes[self.axis], self.fraction * float(groups[1].axes[self.axis][-1])
        return lambda a, b: at_budget(xs, a, x) - final(b)


@dataclass(frozen=True)
class EqualBudget:
    """The first group (V-GRPO) minus the second, both read at the smaller of their two full budgets on ``axis``
    (transformer evaluations or training seconds): the methods at equal cost, whichever costs less per iteration.
    Linear in the groups' seed-mean curves, as every statistic here is."""

    axis: str

    def function(self, groups: list[Group]) -> Callable[..., np.ndarray]:
        xa, xb = groups[0].axes[self.axis], groups[1].axes[self.axis]
        x = min(float(xa[-1]), float(xb[-1]))
        return lambda a, b: at_budget(xa, a, x) - at_budget(xb, b, x)


@dataclass(frozen=True)
class WorstDrops:
    """A combination, linear in the groups, of each group's seed-mean worst drop below the base
    (:meth:`Group.worst_drop`): ``combine(*drops)``."""

    combine: Callable[..., np.ndarray]


@dataclass(frozen=True)
class CvRatio:
    """The second group's mean per-iteration surrogate CV (record field ``key``) over the first's, seeds and
    iterations resampled (:func:`benchmarks.compare.analysis.cv_ratio`)."""

    key: str


@dataclass(frozen=True)
class PaperFactor:
    """Whether the paper's ``ratio`` lies inside the interval of the :class:`CvRatio` row ``of``: no test of its
    own, a reading of that row's interval."""

    of: str
    ratio: float


Statistic = Curves | AtBudget | EqualBudget | WorstDrops | CvRatio | PaperFactor

FINAL_DIFFERENCE = Curves(lambda a, b: final(a) - final(b))
GAIN = Curves(lambda a: final(a) - start(a))
CURVE_MEAN_DIFFERENCE = Curves(lambda a, b: curve_mean(a) - curve_mean(b))
WORST_DROP = WorstDrops(identity)
DROP_DIFFERENCE = WorstDrops(lambda a, b: a - b)
LADDER_DROP_DIFFERENCE = WorstDrops(lambda *d: np.mean([d[i] - d[i + 1] for i in range(0, len(d), 2)], axis=0))
"""Naive minus V-GRPO at each raised rate (the groups of :class:`RaisedRates`), averaged over the rates."""

Describe = Callable[[Groups], str]
"""A note written from a claim's groups before its statistic is read."""
Remark = Callable[[Analysis, Groups, str], str]
"""The row's note once its statistic is read: ``remark(analysis, groups, note so far)``."""


@dataclass(frozen=True)
class Claim:
    """One row of the report, declared before the grid ran (unless ``note`` says otherwise)."""

    id: str
    claim: str  # the claim in the paper's words
    paper: str  # the paper's number (or where the claim comes from)
    rule: str  # the statistic, the threshold and the side, in words
    cells: tuple[Cells, ...] | RaisedRates  # the groups the statistic takes, in its arguments' order
    statistic: Statistic
    threshold: float = 0.0
    side: str = "above"  # reproduced when the statistic is above (or below) the threshold
    reward: str = "geneval"  # whose test prompts (and base) the statistic reads
    confirmatory: bool = False  # in the family Holm's correction covers
    note: str | Describe = ""
    remark: Remark | None = None
    read_last: bool = False
    """Read after every other row: a row added after the grid ran draws from the random stream after the rows the
    grid's rules fixed, whose replicates then stay those of the rules' own code."""
    signed: bool = True
    digits: int = 3


@dataclass(frozen=True)
class ClaimSet:
    """A grid's claims in the report's order; its confirmatory ones are the family Holm's correction covers."""

    name: str
    claims: tuple[Claim, ...]
    one_machine: bool = False
    """Refuse a row whose cells ran on more than one CPU model or thread count (benchmark v4's rule: every group of
    a comparison on one machine type); v2 and v3 read their rows across machines, as they ran."""

    @property
    def confirmatory(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.claims if c.confirmatory)


def gradient_steps(groups: Groups) -> str:
    """E3's note: its margin's history and whether a third of the iterations is a third of the gradient steps."""
    steps = [(k, g.runs[0]["gradient_steps_per_iteration"]) for k, g in groups if g]
    equal = len(steps) == 2 and steps[0][1] == steps[1][1]
    return (
        "one GenEval stage, not the paper's five; gradient steps per iteration "
        + " and ".join(f"{LABELS[k]} {n:g}" for k, n in steps)
        + (", equal: a third of the iterations is a third of the gradient steps" if equal else ", not equal")
    )


def timed_cells(groups: Groups) -> str:
    """A wall-time row's note: how many cells of each method ran with the cores to themselves, on which CPU."""
    (_, v), (_, o) = groups
    if not (v and o):
        return ""
    cpus = "; ".join(sorted(set(v.timed_cpus) | set(o.timed_cpus)))
    return f"seconds from {v.timed_cells} and {o.timed_cells} cells that ran with the cores to themselves (CPU: {cpus})"


def other_plateau(an: Analysis, groups: Groups, note: str) -> str:
    """The note and whether the other method's level has settled: a rising one makes the comparison a lower bound."""
    key, other = groups[1]
    if other is None:
        return note
    return "; ".join(n for n in (note, f"{LABELS[key]}'s last quarter {plateau(an, key, other)}") if n)


def collapse_counts(reward: str, flat: list[Group], an: Analysis) -> str:
    """How many cells of each method collapsed, Fisher's test on the counts and the cells its power needs."""
    base = an.bases[reward]
    assert base is not None
    hits, n_cells = {"naive_elbo": 0, "vgrpo": 0}, {"naive_elbo": 0, "vgrpo": 0}
    for grp in flat:
        for c in grp.runs:
            hits[c["spec"]["method"]] += collapsed(c, base, COLLAPSE_DROP[reward])
            n_cells[c["spec"]["method"]] += 1
    p = fisher_p(hits["naive_elbo"], n_cells["naive_elbo"], hits["vgrpo"], n_cells["vgrpo"])
    return (
        f"collapsed (a drop > {COLLAPSE_DROP[reward]:g} at a point, or diverged): naive "
        f"{hits['naive_elbo']}/{n_cells['naive_elbo']}, V-GRPO {hits['vgrpo']}/{n_cells['vgrpo']}, Fisher "
        f"p = {p:.2f}; Fisher's test has 0.8 power against 'naive collapses half the time, V-GRPO never' "
        f"from {seeds_for_power(0.5, 0.0)} cells per method"
    )


def collapses(reward: str) -> Remark:
    """A stress row's note: the collapse counts over its cells (when any ran)."""

    def remark(an: Analysis, groups: Groups, note: str) -> str:
        flat = [g for _, g in groups if g is not None]
        return collapse_counts(reward, flat, an) if flat else note

    return remark


def own_rate(reward: str, phase: str, lead: str = "not pre-registered") -> Remark:
    """An own-rate stability row's note: ``lead`` (whether the row was pre-registered), where its cells come from,
    and their collapse counts."""

    def remark(an: Analysis, groups: Groups, note: str) -> str:
        if any(g is None for _, g in groups):
            return note
        flat = [g for _, g in groups if g is not None]
        its = flat[1].iterations
        cadence = f"the {phase} cells ({its[-1]:.0f} iterations, evaluated every {its[1] - its[0]:.0f})"
        return f"{lead}; from {cadence}; " + collapse_counts(reward, flat, an)

    return remark
