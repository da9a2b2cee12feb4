"""The grids' claim sets: :data:`V2` (``docs/benchmarks``, :mod:`benchmarks.compare.claims`) and :data:`V3`
(``docs/benchmarks-v3``): the v2 rows as ``docs/benchmarks/v3-preregistration.md`` changes them: E2 confirmatory,
E3's margin and the own-rate rows pre-registered (the latter read from the grid's own-rate phase), and the rows
no affordable seed count powers stated as estimation rows before the grid runs.
"""

from __future__ import annotations

from dataclasses import replace

from benchmarks.compare.claims import CLAIMS, E3_MARGIN, V2
from benchmarks.compare.rules import Cells, Claim, ClaimSet, Describe, Groups, gradient_steps, own_rate

__all__ = ["CLAIM_SETS", "ESTIMATION_NOTE", "ESTIMATION_ROWS", "V2", "V3"]

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

CLAIM_SETS = {c.name: c for c in (V2, V3)}
