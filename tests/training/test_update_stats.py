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


def test_the_ratio_std_is_rebuilt_from_moments_that_average_exactly_over_ranks() -> None:
    from vgrpo.losses import ratio_metrics

    # the batch [0.5, 1.0, 1.5, 1.0] split over two ranks: their stds are 0.25 each, the batch's is sqrt(0.125)
    halves = [ratio_metrics(torch.tensor(h), clip_range=None) for h in ([0.5, 1.0], [1.5, 1.0])]
    assert [h["ratio_std"] for h in halves] == [0.25, 0.25]
    reduced = {key: [(halves[0][key] + halves[1][key]) / 2] for key in ("ratio_mean", "ratio_dev_sq", "ratio_std")}
    m = step_summary(reduced)
    assert m["train/ratio_std"] == pytest.approx(0.125**0.5) and "train/ratio_dev_sq" not in m
    # two steps: on-policy (r = 1), then mean 1.1 and E[(r - 1)^2] = 0.02, so std^2 = 0.02 - 0.01
    two = step_summary({"ratio_mean": [1.0, 1.1], "ratio_dev_sq": [0.0, 0.02], "ratio_std": [0.0, 0.0]})
    assert two["train/ratio_std_first"] == 0.0 and two["train/ratio_std_last"] == pytest.approx(0.1)
