"""The merged-LoRA fast path of the no-grad forwards (precision.merged_lora)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tests.algorithms.helpers import GROUP, PROMPTS, make_config, make_policy
from vgrpo.algorithms import build_algorithm
from vgrpo.config import load_config
from vgrpo.demo import toy_reward
from vgrpo.models.merged_lora import MergedLoRAVelocity, lora_layers
from vgrpo.models.precision import apply_precision
from vgrpo.models.tiny import TINY_LATENT_SHAPE, tiny_conditioning
from vgrpo.policy import trainable_parameters
from vgrpo.training.iteration import train_iteration
from vgrpo.training.optim import build_optimizer


def _inputs(n: int = 4) -> tuple[torch.Tensor, torch.Tensor, object]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(n, *TINY_LATENT_SHAPE, generator=g), torch.rand(n, generator=g), tiny_conditioning(n)


def test_merged_no_grad_forward_agrees_and_changes_no_weight() -> None:
    policy = make_policy(make_config({"name": "vgrpo"}))
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    merged = MergedLoRAVelocity(policy)
    x, t, cond = _inputs()
    with torch.no_grad():
        factored, fast = policy(x, t, cond), merged(x, t, cond)
    torch.testing.assert_close(fast, factored, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())
    assert all(not layer.disable_adapters for layer in lora_layers(policy).values())
    assert all(p.requires_grad for p in trainable_parameters(policy))


def test_the_merged_forward_runs_no_lora_matmul() -> None:
    """The merged forward saves exactly the rank-r products: ``2 rows r (in + out)`` per LoRA layer."""
    policy = make_policy(make_config({"name": "vgrpo"}))
    x, t, cond = _inputs()
    layers = lora_layers(policy)
    rows: dict[str, int] = {}
    hooks = [
        layer.get_base_layer().register_forward_hook(
            lambda m, inputs, out, name=name: rows.__setitem__(name, inputs[0].numel() // inputs[0].shape[-1])
        )
        for name, layer in layers.items()
    ]

    def flops(fn: Callable[[], object]) -> int:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            fn()
        return int(counter.get_total_flops())

    factored = flops(lambda: policy(x, t, cond))
    for hook in hooks:
        hook.remove()
    merged = MergedLoRAVelocity(policy)
    merged.merged_weights()  # the merge itself (2 out r in per layer) is paid once per update, not per forward
    fast = flops(lambda: merged(x, t, cond))
    saved = 0
    for name, layer in layers.items():
        base, rank = layer.get_base_layer(), layer.r[layer.active_adapters[0]]
        saved += 2 * rows[name] * rank * (base.in_features + base.out_features)
    assert saved > 0 and factored - fast == saved


def test_with_gradients_the_factored_lora_is_used_and_trained() -> None:
    policy = make_policy(make_config({"name": "vgrpo"}))
    merged = MergedLoRAVelocity(policy)
    x, t, cond = _inputs()
    merged(x, t, cond).square().mean().backward()
    grads = [p.grad for p in trainable_parameters(policy)]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads if g is not None)


def test_merged_weights_follow_an_optimizer_step() -> None:
    """The cache is keyed on the adapters' versions: after a step the fast path uses the new adapters."""
    policy = make_policy(make_config({"name": "vgrpo"}))
    merged = MergedLoRAVelocity(policy)
    x, t, cond = _inputs()
    with torch.no_grad():
        merged(x, t, cond)
    optimizer = torch.optim.SGD(trainable_parameters(policy), lr=0.5)
    merged(x, t, cond).square().mean().backward()
    optimizer.step()
    with torch.no_grad():
        torch.testing.assert_close(merged(x, t, cond), policy(x, t, cond), rtol=1e-5, atol=1e-5)


def test_an_iteration_with_merged_lora_matches_the_factored_one() -> None:
    """One V-GRPO iteration: the same rewards and weights within float32 rounding; the on-policy ratio stays 1
    within 1e-5 although the behaviour surrogates come from the merged forward."""
    config = make_config({"name": "vgrpo"})
    results = []
    for fast in (False, True):
        policy = make_policy(config)
        trained = apply_precision(policy, policy, autocast="fp32", gradient_checkpointing=False, merged_lora=fast)
        algorithm = build_algorithm(config, policy=trained, latent_shape=TINY_LATENT_SHAPE)
        record = train_iteration(
            policy=trained,
            algorithm=algorithm,
            optimizer=build_optimizer(trained, config.optim),
            reward_fn=toy_reward,
            prompts=[f"p{i}" for i in range(PROMPTS)],
            cond=tiny_conditioning(PROMPTS),
            config=config,
            latent_shape=TINY_LATENT_SHAPE,
            generator=torch.Generator().manual_seed(0),
            iteration=0,
        )
        results.append((record, [p.detach().clone() for p in trainable_parameters(policy)]))
    (plain, plain_w), (fast, fast_w) = results
    assert fast.samples.shape[0] == PROMPTS * GROUP
    torch.testing.assert_close(fast.samples, plain.samples, rtol=1e-4, atol=1e-5)
    assert abs(fast.metrics["train/ratio_mean_first"] - 1.0) < 1e-5
    for a, b in zip(plain_w, fast_w, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_merged_lora_needs_lora() -> None:
    with pytest.raises(ValueError, match=r"precision\.merged_lora needs lora"):
        load_config(overrides={"lora": None, "precision": {"merged_lora": True}})


@pytest.mark.slow
def test_compiled_policy_agrees_with_eager_and_keeps_its_names() -> None:
    """precision.compile: the same velocities and gradients as eager within float32 rounding; names unchanged."""
    config = make_config({"name": "vgrpo"})
    eager, compiled = make_policy(config), make_policy(config)
    names = list(compiled.state_dict())
    compiled = apply_precision(
        compiled, compiled.transformer, autocast="fp32", gradient_checkpointing=False, compile=True
    )
    assert list(compiled.state_dict()) == names
    x, t, cond = _inputs()
    for policy in (eager, compiled):
        policy(x, t, cond).square().mean().backward()
    torch.testing.assert_close(compiled(x, t, cond), eager(x, t, cond), rtol=1e-4, atol=1e-5)
    for a, b in zip(trainable_parameters(eager), trainable_parameters(compiled), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6)


def test_the_speed_settings_dump_only_when_set() -> None:
    """Off, they leave a config's dump (its fingerprint, benchmark cells' recorded configs) as it was before."""
    assert {"compile", "merged_lora"}.isdisjoint(load_config(overrides={}).model_dump()["precision"])
    dumped = load_config(overrides={"precision": {"merged_lora": True}}).model_dump()["precision"]
    assert dumped["merged_lora"] is True and "compile" not in dumped
    assert load_config(overrides={"precision": dumped}).precision.merged_lora is True
