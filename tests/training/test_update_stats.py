"""The gradient steps' diagnostics: per-step metrics summarised, and the norm of the weights' change."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vgrpo.training.update_stats import step_summary, update_norms, weights_before


def test_step_summary_averages_every_key_and_keeps_the_ends_of_the_ratio_keys() -> None:
    m = step_summary({"ratio_std": [0.0, 0.2, 0.4], "grad_norm": [1.0, 3.0, 5.0]})
    assert m["train/ratio_std"] == pytest.approx(0.2) and m["train/grad_norm"] == pytest.approx(3.0)
    assert m["train/ratio_std_first"] == 0.0 and m["train/ratio_std_last"] == 0.4
    assert "train/grad_norm_first" not in m


def test_a_method_without_a_ratio_has_no_ratio_keys() -> None:
    assert step_summary({"loss": [2.0, 4.0]}) == {"train/loss": 3.0}


def test_update_norms_measure_the_change_as_one_vector_against_the_weights_before() -> None:
    params = [nn.Parameter(torch.tensor([3.0, 0.0])), nn.Parameter(torch.tensor([[4.0]]))]
    before = weights_before(params)
    with torch.no_grad():
        params[0].add_(torch.tensor([0.0, 1.5]))  # |delta|^2 = 2.25 + 4 = 6.25
        params[1].add_(2.0)
    m = update_norms(before, params)
    assert m == {"update/norm": pytest.approx(2.5), "update/param_norm": pytest.approx(5.0), "update/norm_rel": 0.5}
    assert torch.equal(before[0], torch.tensor([3.0, 0.0]))  # the copies did not follow the weights


def test_update_norms_of_zero_weights_and_of_no_weights() -> None:
    zero = [nn.Parameter(torch.zeros(3))]
    assert update_norms(weights_before(zero), zero)["update/norm_rel"] == 0.0
    assert update_norms([], [])["update/norm"] == 0.0
