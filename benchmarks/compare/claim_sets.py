"""The grids' claim sets: :data:`V2` (``docs/benchmarks``, :mod:`benchmarks.compare.claims`) and :data:`V3`
(``docs/benchmarks-v3``): the v2 rows as ``docs/benchmarks/v3-preregistration.md`` changes them: E2 confirmatory,
E3's margin and the own-rate rows pre-registered (the latter read from the grid's own-rate phase), and the rows
no affordable seed count powers stated as estimation rows before the grid runs; and :data:`V4`, benchmark v4's
(a draft until its pre-registration): v3's rows in the words of what each tests, V-GRPO against DiffusionNFT at
equal iterations, NFE and seconds, and no row read across machine types.
"""

from __future__ import annotations

from dataclasses import replace

from benchmarks.compare.analysis import AXES, Analysis, cells
from benchmarks.compare.claims import CLAIMS, E3_MARGIN, V2, V
from benchmarks.compare.rules import (
    FINAL_DIFFERENCE,
    Cells,
    Claim,
    ClaimSet,
    Describe,
    EqualBudget,
    Groups,
    gradient_steps,
    other_plateau,
    own_rate,
    timed_cells,
)

__all__ = ["CLAIM_SETS", "ESTIMATION_NOTE", "ESTIMATION_ROWS", "V2", "V3", "V4"]

ESTIMATION_ROWS = ("E3", "N1", "N2", "S1", "S1o", "S2o", "A2", "A3", "A4", "A5")
"""v3's rows that no affordable seed count powers at the v2 variances (the pre-registration's power analysis):
their interval is the result and *unresolved* their expected verdict, said in their note before the grid runs."""
ESTIMATION_NOTE = "pre-registered estimation row: no affordable seed count powers it, its interval is the result"
OWN_RATE_CELLS = {
    reward: (Cells("own_rate", "naive_elbo", reward, "x1"), Cells("own_rate", "vgrpo", reward, "x1"))
    for reward in ("geneval", "preference")
}
"""v3's own-rate stability cells: each method at its own rate, evaluated as often as the stress cells."""


def e3_note_v3(groups: Groups) -> str:
    return f"margin {E3_MARGIN:g}, the paper's own gap (0.94 - 0.91), pre-registered; " + gradient_steps(groups)


def lead_with(prefix: str, note: str | Describe) -> str | Describe:
    """``note`` (words, or a function of the groups) after ``prefix``."""
    if isinstance(note, str):
        return "; ".join(n for n in (prefix, note) if n)
    return lambda groups: "; ".join(n for n in (prefix, note(groups)) if n)


def as_v3(claim: Claim) -> Claim:
    """A v2 claim as the v3 pre-registration states it."""
    if claim.id == "E2":
        claim = replace(claim, confirmatory=True)
    if claim.id == "E3":
        claim = replace(claim, note=e3_note_v3)
    if claim.id in ("S1o", "S2o"):
        remark = own_rate(claim.reward, "own_rate", lead=ESTIMATION_NOTE)
        claim = replace(claim, cells=OWN_RATE_CELLS[claim.reward], remark=remark, read_last=False)
    if claim.id in ESTIMATION_ROWS:
        claim = replace(claim, note=lead_with(ESTIMATION_NOTE, claim.note))
    return claim


V3 = ClaimSet("v3", tuple(as_v3(c) for c in CLAIMS))
"""The v3 grid's claims (``docs/benchmarks-v3``), fixed by the pre-registration commit."""


# -- Benchmark v4 (a draft until docs/benchmarks-v4's pre-registration fixes it): v3's rows in the words of what
# each tests (an independent read of the v3 report found E1's "2x faster", S2's "unstable where V-GRPO is not" and
# the A rows' paper words broader than their rules), the wall-time rows beside the iteration rows they qualify,
# V-GRPO against DiffusionNFT at equal iterations, NFE and seconds, and no row read across machine types.
EQUAL_COST_MARGIN = E3_MARGIN
"""The equal-cost rows' non-inferiority margin against DiffusionNFT: E3's, the paper's own gap (0.94 - 0.91)."""
WORDS_V4 = {
    "E1": "At half MixGRPO's iterations V-GRPO scores higher than MixGRPO at its full budget",
    "E2": "At half Flow-GRPO's iterations V-GRPO scores higher than Flow-GRPO at its full budget",
    "E3": "At a third of DiffusionNFT's iterations V-GRPO is within 0.03 of DiffusionNFT at its full budget",
    "E4": "At half MixGRPO's training seconds V-GRPO scores higher than MixGRPO at its full budget",
    "E5": "At half Flow-GRPO's training seconds V-GRPO scores higher than Flow-GRPO at its full budget",
    "N1": "V-GRPO ends no more than 0.02 below naive ELBO-GRPO",
    "S1": "Naive ELBO-GRPO drops further below the base than V-GRPO at {rates} each method's own rate (GenEval stage)",
    "S2": "Naive ELBO-GRPO drops further below the base than V-GRPO at {rates} each method's own rate (preference "
    "stage)",
    "A1": "N_MC 2 ends at most 0.02 above the base (fails to converge)",
    "A2": "N_MC 2's curve lies below V-GRPO's (the mean over the evaluation points)",
    "A3": "N_MC 8 ends less than 0.02 above V-GRPO",
    "A4": "v-prediction never drops 0.1 or more below the base (stable)",
    "A5": "v-prediction's curve lies below x-prediction's (the mean over the evaluation points)",
    "A6": "eps-prediction drops more than 0.1 below the base at some point, or diverges (collapses)",
}
"""v4's words for the rows whose v3 words claimed more than their rules test; the other rows keep theirs."""
ORDER_V4 = ("E1", "E4", "E2", "E5", "E3", "D1", "D2", "D3")
"""The efficiency rows first, each wall-time row beside the iteration row it qualifies; the rest in v3's order."""


V2_CLAIMS = {c.id: c for c in CLAIMS}
"""v2's claims by id: v4 starts each row's note from v2's (v3's added the estimation notes)."""


def chosen_recipe(an: Analysis, groups: Groups, note: str) -> str:
    """An ablation row's note: the variant runs V-GRPO's chosen recipe and rate (its N_MC named), not retuned."""
    runs = cells(an.records, "methods", "vgrpo")  # its config alone: no group (score arrays) built per row
    n_mc = (runs[0].get("config") or {}).get("algorithm", {}).get("n_mc") if runs else None
    where = f"at V-GRPO's chosen recipe and rate (N_MC {n_mc}), not retuned for the variant" if n_mc else ""
    return "; ".join(n for n in (where, note) if n)


def equal_cost(id_: str, axis: str, confirmatory: bool) -> Claim:
    """V-GRPO against DiffusionNFT at equal cost on ``axis``: non-inferiority at :data:`EQUAL_COST_MARGIN`."""
    budget = {
        "iteration": "at equal iterations",
        "nfe": "at equal transformer evaluations (NFE)",
        "train_s": "at equal training seconds",
    }[axis]
    rule = (
        "final V-GRPO minus DiffusionNFT"
        if axis == "iteration"
        else f"V-GRPO minus DiffusionNFT, both at the smaller of their full budgets in {AXES[axis].split(' (')[0]}"
    )
    return Claim(
        id_,
        f"V-GRPO is within {EQUAL_COST_MARGIN:g} of DiffusionNFT {budget}",
        "V-GRPO matches DiffusionNFT (SD3.5-M GenEval 0.91 against 0.94)",
        f"{rule} > {-EQUAL_COST_MARGIN:g} (non-inferiority, margin {EQUAL_COST_MARGIN:g})",
        (V, Cells("methods", "diffusion_nft")),
        FINAL_DIFFERENCE if axis == "iteration" else EqualBudget(axis),
        threshold=-EQUAL_COST_MARGIN,
        confirmatory=confirmatory,
        note=timed_cells if axis == "train_s" else "",
        remark=other_plateau,
    )


def as_v4(claim: Claim) -> Claim:
    """A v3 claim as benchmark v4 states it: its tested words; an ablation's note names the chosen recipe; no
    pre-registered estimation note (v4's own power analysis decides which rows are estimation rows)."""
    claim = replace(claim, note=V2_CLAIMS[claim.id].note, claim=WORDS_V4.get(claim.id, claim.claim))
    if claim.id == "E3":
        claim = replace(claim, note=e3_note_v3)
    if claim.id in ("S1o", "S2o"):
        claim = replace(claim, remark=own_rate(claim.reward, "own_rate", lead="pre-registered"))
    if isinstance(claim.cells, tuple) and any(c.phase == "ablation" for c in claim.cells):
        claim = replace(claim, note="", remark=chosen_recipe)
    return claim


def _v4_claims() -> tuple[Claim, ...]:
    rows = {c.id: as_v4(c) for c in V3.claims}
    rows |= {
        "D1": equal_cost("D1", "iteration", confirmatory=True),
        "D2": equal_cost("D2", "nfe", confirmatory=True),
        "D3": equal_cost("D3", "train_s", confirmatory=False),
    }
    return tuple(rows[i] for i in ORDER_V4) + tuple(c for i, c in rows.items() if i not in ORDER_V4)


V4 = ClaimSet("v4", _v4_claims(), one_machine=True)
"""Benchmark v4's claims: a draft until ``docs/benchmarks-v4``'s pre-registration commit fixes them."""

CLAIM_SETS = {c.name: c for c in (V2, V3, V4)}
