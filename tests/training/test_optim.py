"""The shared optimiser: AdamW from one config (parameter groups may override it) and the global-norm clip."""

from __future__ import annotations

import pytest
import torch

from vgrpo.training.optim import AdamWConfig, OptimConfig, build_adamw, clip_gradients


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


def test_adamw8bit_without_bitsandbytes_is_a_config_error_naming_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from vgrpo.errors import ConfigError

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # as if not installed
    p = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ConfigError, match=r"optim\.optimizer: adamw8bit needs the bitsandbytes package"):
        build_adamw([p], OptimConfig(optimizer="adamw8bit"))
    assert isinstance(build_adamw([p], OptimConfig()), torch.optim.AdamW)
    with pytest.raises(ValueError, match="optimizer"):
        OptimConfig(optimizer="sgd")


def test_adamw8bit_keeps_8_bit_moments_and_follows_adamw() -> None:
    bnb = pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    start, grads = torch.randn(128, 64), [torch.randn(128, 64) for _ in range(5)]
    rl = OptimConfig(optimizer="adamw8bit", lr=1e-2)
    params = {}
    for kind in ("adamw", "adamw8bit"):
        p = torch.nn.Parameter(start.clone())
        config = rl.model_copy(update={"optimizer": kind})
        opt = build_adamw([p], config, betas=config.betas, eps=config.adam_eps)
        for g in grads:
            p.grad = g.clone()
            opt.step()
        params[kind] = p.detach()
    assert isinstance(opt, bnb.optim.AdamW8bit) and opt.state[p]["state1"].dtype == torch.uint8
    moved = (params["adamw"] - start).abs().mean()
    # Quantised moments: the same direction of travel, not the same bits.
    assert (params["adamw8bit"] - params["adamw"]).abs().mean() < 0.1 * moved


def test_adamw8bit_state_goes_through_a_checkpoint_and_resumes_bit_exactly(tmp_path) -> None:
    pytest.importorskip("bitsandbytes")
    from vgrpo.checkpoints.state import load_training_state, save_training_state

    torch.manual_seed(0)
    config = OptimConfig(optimizer="adamw8bit", lr=1e-2)
    models = [torch.nn.Linear(128, 64) for _ in range(2)]
    opts = [build_adamw(list(m.parameters()), config, betas=config.betas, eps=config.adam_eps) for m in models]
    for _ in range(3):
        models[0].zero_grad()
        models[0](torch.randn(8, 128)).square().sum().backward()
        opts[0].step()
    state = opts[0].state_dict()["state"]
    assert all(not isinstance(v, dict) for s in state.values() for v in s.values())  # flat: tensors and scalars
    save_training_state(tmp_path / "ck", module=models[0], optimizer=opts[0], snapshots={}, state={})
    load_training_state(tmp_path / "ck", module=models[1], optimizer=opts[1], snapshots={})
    x = torch.randn(8, 128)
    for model, opt in zip(models, opts, strict=True):
        model.zero_grad()
        model(x).square().sum().backward()
        opt.step()
    assert torch.equal(models[0].weight, models[1].weight) and torch.equal(models[0].bias, models[1].bias)
