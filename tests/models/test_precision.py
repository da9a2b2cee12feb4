"""bf16 autocast and gradient checkpointing (vgrpo/models/precision.py): the on-policy ratio stays 1 because
the behaviour and trained surrogates go through the same precision; checkpointing leaves gradients unchanged."""

import pytest
import torch

from tests.algorithms.helpers import GROUP, PROMPTS, grads, make_config, make_policy, prepared
from vgrpo.models.precision import AttentionKernelVelocity, AutocastVelocity, apply_precision

N = PROMPTS * GROUP


def _ratio_deviation(metrics):
    return max(abs(metrics["ratio_max"] - 1.0), abs(metrics["ratio_min"] - 1.0))


@pytest.mark.parametrize("memory_bounded", [False, True])
def test_on_policy_ratio_is_one_in_fp32(memory_bounded):
    config = make_config({"name": "vgrpo", "memory_bounded": memory_bounded, "n_mc": 4})
    policy = make_policy(config)
    algorithm, batch = prepared(config, policy)
    # step=1 makes the two-pass update recompute the surrogates instead of reusing the old ones (step 0 does)
    metrics = algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=1)
    assert _ratio_deviation(metrics) <= 1e-6


@pytest.mark.parametrize("memory_bounded", [False, True])
def test_on_policy_ratio_is_one_with_bf16_autocast(memory_bounded):
    config = make_config({"name": "vgrpo", "memory_bounded": memory_bounded, "n_mc": 4})
    policy = AutocastVelocity(make_policy(config))
    algorithm, batch = prepared(config, policy)
    assert batch.payload.old_surrogates.dtype == torch.float32
    metrics = algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=1)
    # Rollout and training share the autocast wrapper, so the same bf16 kernels run twice: measured 0 on CPU.
    # The stated tolerance leaves room for nondeterministic GPU kernels.
    assert _ratio_deviation(metrics) <= 1e-3


def test_a_precision_mismatch_between_behaviour_and_trained_policy_moves_the_ratio():
    """The pitfall the shared wrapper avoids: old surrogates in fp32, new ones in bf16."""
    config = make_config({"name": "vgrpo", "memory_bounded": False, "n_mc": 4})
    fp32_policy = make_policy(config)
    algorithm, batch = prepared(config, fp32_policy)
    metrics = algorithm.accumulate_gradients(AutocastVelocity(fp32_policy), batch, torch.arange(N), step=1)
    # Measured 1.4e-4 on this 2-layer model, against exactly 0 with one precision for both (tests above).
    assert _ratio_deviation(metrics) > 5e-5


def test_autocast_returns_float32_velocities_close_to_fp32():
    config = make_config({"name": "vgrpo"})
    policy = make_policy(config)
    from vgrpo.models.tiny import TINY_LATENT_SHAPE, tiny_conditioning

    x = torch.randn(N, *TINY_LATENT_SHAPE, generator=torch.Generator().manual_seed(0))
    t = torch.full((N,), 0.5)
    cond = tiny_conditioning(PROMPTS).repeat_interleave(GROUP)
    with torch.no_grad():
        v32, v16 = policy(x, t, cond), AutocastVelocity(policy)(x, t, cond)
    assert v16.dtype == torch.float32
    rel = ((v16 - v32).norm() / v32.norm()).item()
    assert 0 < rel < 0.05  # bf16 really ran (not bit-equal) and stayed close


def test_gradient_checkpointing_leaves_the_gradients_unchanged():
    config = make_config({"name": "vgrpo", "n_mc": 2})
    results = []
    for checkpointing in (False, True):
        policy = make_policy(config)
        policy = apply_precision(policy, policy.transformer, autocast="fp32", gradient_checkpointing=checkpointing)
        assert policy.transformer.is_gradient_checkpointing is checkpointing
        algorithm, batch = prepared(config, policy)
        policy.train()
        algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=1)
        results.append(grads(policy))
    for plain, recomputed in zip(*results, strict=True):
        torch.testing.assert_close(recomputed, plain, rtol=1e-5, atol=1e-7)


def test_apply_precision_wraps_only_for_bf16():
    config = make_config({"name": "vgrpo"})
    policy = make_policy(config)
    assert apply_precision(policy, policy.transformer, autocast="fp32", gradient_checkpointing=False) is policy
    wrapped = apply_precision(policy, policy.transformer, autocast="bf16", gradient_checkpointing=False)
    assert isinstance(wrapped, AutocastVelocity) and wrapped.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="fp32 or bf16"):
        apply_precision(policy, policy.transformer, autocast="fp16", gradient_checkpointing=False)  # type: ignore[arg-type]


@pytest.mark.parametrize("kernel", ["math", "flash"])
def test_one_attention_kernel_matches_the_default_dispatch_in_fp32(kernel):
    """precision.attention: the velocities and the LoRA gradients through one kernel agree with torch's default
    dispatch (the CPU flash kernel at these shapes) to float32 rounding; ``flash`` is that kernel itself."""
    config = make_config({"name": "vgrpo", "n_mc": 2})
    results = []
    for attention in ("auto", kernel):
        policy = make_policy(config)
        policy = apply_precision(
            policy, policy.transformer, autocast="fp32", gradient_checkpointing=False, attention=attention
        )
        assert isinstance(policy, AttentionKernelVelocity) == (attention != "auto")
        algorithm, batch = prepared(config, policy)
        algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=1)
        results.append((batch.payload.old_surrogates, grads(policy)))
    (old_auto, grads_auto), (old_kernel, grads_kernel) = results
    if kernel == "flash":
        torch.testing.assert_close(old_kernel, old_auto, rtol=0, atol=0)
    else:  # measured 1.2e-7 (surrogates, absolute) and 7.3e-7 (gradients, of their largest element) here
        torch.testing.assert_close(old_kernel, old_auto, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads_kernel, grads_auto, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_the_math_kernel_really_runs_and_keeps_the_on_policy_ratio_at_one_under_bf16():
    """The behaviour and the trained surrogates go through the same kernel (the no-grad and the gradient forwards
    alike), so on-policy the ratio is 1 under bf16 autocast as without the setting; the profiler sees the math
    kernel and no flash kernel."""
    config = make_config({"name": "vgrpo", "memory_bounded": False, "n_mc": 4})
    base = make_policy(config)
    policy = apply_precision(base, base.transformer, autocast="bf16", gradient_checkpointing=False, attention="math")
    assert isinstance(policy, AutocastVelocity) and isinstance(policy.policy, AttentionKernelVelocity)
    algorithm, batch = prepared(config, policy)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        metrics = algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=1)
    assert _ratio_deviation(metrics) <= 1e-3
    names = {event.name for event in prof.events()}
    assert "aten::_scaled_dot_product_attention_math" in names
    assert not any("flash_attention" in name for name in names)


def test_apply_precision_refuses_an_unknown_attention_kernel():
    config = make_config({"name": "vgrpo"})
    policy = make_policy(config)
    with pytest.raises(ValueError, match=r"precision\.attention"):
        apply_precision(policy, policy.transformer, autocast="fp32", gradient_checkpointing=False, attention="xla")  # type: ignore[arg-type]


def test_the_sigmoid_form_of_gelu_is_the_tanh_approximation_and_needs_compile():
    """precision.gelu: sigmoid swaps every tanh-approximate diffusers GELU (the state dict unchanged) for
    ``x sigmoid(2 z)``, which equals torch's tanh form to float32 rounding, in float32 and from bf16 inputs."""
    from diffusers.models.activations import GELU

    from vgrpo.models.config import PrecisionConfig
    from vgrpo.models.gelu import SigmoidFormGELU, use_sigmoid_gelu

    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 4
    layer = GELU(8, 8, approximate="tanh")
    reference = layer.gelu(x)
    names = set(layer.state_dict())
    assert use_sigmoid_gelu(torch.nn.Sequential(layer, GELU(8, 8))) == 1  # the exact GELU is left alone
    assert isinstance(layer, SigmoidFormGELU) and set(layer.state_dict()) == names
    torch.testing.assert_close(layer.gelu(x), reference, rtol=1e-6, atol=1e-6)
    bf16 = x.bfloat16()
    out = layer.gelu(bf16)
    assert out.dtype == torch.bfloat16  # computed in float32, rounded once: at most one bf16 step from torch's
    torch.testing.assert_close(out, torch.nn.functional.gelu(bf16, approximate="tanh"), rtol=2**-7, atol=1e-6)

    config = make_config({"name": "vgrpo"})
    policy = make_policy(config)
    before = policy(*_inputs())
    swapped = apply_precision(policy, policy.transformer, autocast="fp32", gradient_checkpointing=False, gelu="sigmoid")
    assert any(isinstance(m, SigmoidFormGELU) for m in swapped.modules())
    torch.testing.assert_close(swapped(*_inputs()), before, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="gelu: sigmoid needs compile"):
        PrecisionConfig(gelu="sigmoid")
    assert PrecisionConfig(gelu="sigmoid", compile=True).gelu == "sigmoid"


def _inputs():
    from vgrpo.models.tiny import TINY_LATENT_SHAPE, tiny_conditioning

    x = torch.randn(2, *TINY_LATENT_SHAPE, generator=torch.Generator().manual_seed(1))
    return x, torch.full((2,), 0.3), tiny_conditioning(1).repeat_interleave(2)
