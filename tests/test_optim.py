"""The shared optimiser: AdamW from one config (parameter groups may override it) and the global-norm clip."""

from __future__ import annotations

import pytest
import torch

from vgrpo.optim import AdamWConfig, OptimConfig, build_adamw, clip_gradients


def test_build_adamw_takes_the_config_and_lets_groups_override_it() -> None:
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    opt = build_adamw([{"params": [a]}, {"params": [b], "weight_decay": 0.0}], AdamWConfig(lr=0.1, weight_decay=0.5))
    assert [(g["lr"], g["weight_decay"]) for g in opt.param_groups] == [(0.1, 0.5), (0.1, 0.0)]
    assert opt.param_groups[0]["betas"] == (0.9, 0.999) and opt.param_groups[0]["eps"] == 1e-8
    rl = OptimConfig(betas=(0.8, 0.99), adam_eps=1e-6)
    opt = build_adamw([a], rl, betas=rl.betas, eps=rl.adam_eps)
    assert (opt.param_groups[0]["lr"], opt.param_groups[0]["betas"], opt.param_groups[0]["eps"]) == (
        3e-4,
        (0.8, 0.99),
        1e-6,
    )


@pytest.mark.parametrize(("max_norm", "after"), [(1.0, 1.0), (None, 10.0)])
def test_clip_gradients_scales_to_the_norm_or_leaves_them(max_norm: float | None, after: float) -> None:
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([6.0, 8.0])
    norm = clip_gradients([p], AdamWConfig(max_grad_norm=max_norm))
    assert float(norm) == pytest.approx(10.0)
    assert float(p.grad.norm()) == pytest.approx(after, rel=1e-5)
