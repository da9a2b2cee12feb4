"""FLUX.2 in the pipeline, on a tiny Flux2Pipeline built offline: the family's stage contract
(tests/models/family_contract.py: a stage on a saved directory trains its LoRA, exported for a plain Flux2Pipeline, or
every weight, exported as a whole pipeline; a killed stage resumes to the weights of the uninterrupted one, bit for
bit), the evaluation sampling at FLUX.2's shift for its own 2 steps."""

from __future__ import annotations

import math

import pytest

from tests.models.family_contract import FamilyStageContract
from vgrpo.models.tiny_flux2 import tiny_flux2_pipeline


def _shift(steps: int) -> float:
    from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

    return math.exp(compute_empirical_mu(16, steps))


class TestFlux2Stage(FamilyStageContract):
    family = "flux2"
    evaluation_shift = _shift(2)  # the evaluation's own 2 steps (the rollouts' 3 steps give another one)
    tiny_pipeline = staticmethod(lambda prompts: tiny_flux2_pipeline(seed=0))  # a byte-level tokenizer

    def test_the_evaluation_s_shift_is_flux2_s_for_its_own_steps(self) -> None:
        assert self.evaluation_shift == pytest.approx(7.1020, abs=1e-4) and _shift(3) == pytest.approx(7.0484, abs=1e-4)
