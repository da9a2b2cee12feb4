import pytest
import torch

from vgrpo.losses import (
    clipped_policy_loss,
    flow_grpo_loss,
    nft_loss,
    vgrpo_loss,
    vgrpo_ratio,
    vgrpo_surrogate_coefficients,
)
from vgrpo.surrogate import elbo_surrogate


def _ppo_reference(ratio, adv, eps):
    """Hand-written PPO loop, element by element."""
    total = 0.0
    for r, a in zip(ratio.tolist(), adv.tolist(), strict=True):
        clipped = min(max(r, 1 - eps), 1 + eps)
        total += max(-a * r, -a * clipped)
    return total / len(ratio)


def test_clipped_policy_loss_matches_reference_loop():
    ratio = torch.tensor([0.5, 0.99, 1.0, 1.02, 1.5, 0.7])
    adv = torch.tensor([1.0, -2.0, 0.3, -1.0, 2.0, -0.5])
    loss, m = clipped_policy_loss(ratio=ratio, advantages=adv, clip_range=0.2)
    assert loss.item() == pytest.approx(_ppo_reference(ratio, adv, 0.2), rel=1e-6)
    assert m["clip_frac_low"] == pytest.approx(2 / 6) and m["clip_frac_high"] == pytest.approx(1 / 6)


def test_ratio_of_one_has_zero_clip_fraction_and_zero_approx_kl():
    _, m = clipped_policy_loss(ratio=torch.ones(5), advantages=torch.randn(5), clip_range=1e-4)
    assert m["clip_frac"] == 0 and m["approx_kl"] == 0 and m["ratio_min"] == m["ratio_max"] == 1


def test_vgrpo_ratio_puts_the_monte_carlo_mean_inside_the_exp():
    s = torch.tensor([[-1.0, -3.0], [0.0, -2.0]])
    s_old = torch.tensor([[-2.0, -2.0], [-1.0, -1.0]])
    expected = torch.tensor([1.0, 1.0])  # exp(mean(-1, -3) - mean(-2, -2)) = exp(0)
    torch.testing.assert_close(vgrpo_ratio(surrogates=s, old_surrogates=s_old), expected)
    mean_of_exps = torch.exp(s - s_old).mean(dim=1)
    assert not torch.allclose(mean_of_exps, expected)  # the other order would not be 1


def test_vgrpo_loss_is_odd_in_advantages_without_kl():
    g = torch.Generator().manual_seed(0)
    s_old = torch.randn(6, 3, generator=g)
    s = s_old + 0.1 * torch.randn(6, 3, generator=g)
    adv = torch.randn(6, generator=g)
    for clip in (None,):
        pos, _ = vgrpo_loss(surrogates=s, old_surrogates=s_old, advantages=adv, clip_range=clip)
        neg, _ = vgrpo_loss(surrogates=s, old_surrogates=s_old, advantages=-adv, clip_range=clip)
        assert pos.item() == pytest.approx(-neg.item(), rel=1e-6)
    # At rho = 1 (first gradient step) the identity holds with clipping too.
    pos, _ = vgrpo_loss(surrogates=s_old, old_surrogates=s_old, advantages=adv, clip_range=0.01)
    neg, _ = vgrpo_loss(surrogates=s_old, old_surrogates=s_old, advantages=-adv, clip_range=0.01)
    assert pos.item() == pytest.approx(-neg.item(), rel=1e-6)


def test_vgrpo_loss_adds_beta_times_kl():
    s = torch.zeros(2, 2)
    kl = torch.tensor([[1.0, 3.0], [0.0, 0.0]])
    loss, m = vgrpo_loss(surrogates=s, old_surrogates=s, advantages=torch.zeros(2), clip_range=None, kl=kl, kl_coef=0.3)
    assert loss.item() == pytest.approx(0.3 * 1.0) and m["kl"] == pytest.approx(1.0)


@pytest.mark.parametrize("clip", [None, 0.05])
def test_surrogate_coefficients_equal_autograd_of_vgrpo_loss(clip):
    g = torch.Generator().manual_seed(1)
    s_old = torch.randn(8, 4, generator=g)
    s = (s_old + 0.2 * torch.randn(8, 4, generator=g)).requires_grad_(True)
    adv = torch.randn(8, generator=g)
    loss, m = vgrpo_loss(surrogates=s, old_surrogates=s_old, advantages=adv, clip_range=clip)
    (grad,) = torch.autograd.grad(loss, s)
    if clip is not None:
        assert m["clip_frac"] > 0  # the test must exercise the clipped branch
    coef = vgrpo_surrogate_coefficients(
        ratio=vgrpo_ratio(surrogates=s.detach(), old_surrogates=s_old),
        advantages=adv,
        clip_range=clip,
        n_mc=4,
        num_samples=8,
    )
    torch.testing.assert_close(grad, coef[:, None].expand(8, 4), rtol=1e-6, atol=1e-7)


def test_flow_grpo_loss_clips_per_step_and_adds_kl():
    lp_old = torch.tensor([0.0, 0.0, 0.0])
    lp = torch.tensor([0.1, -0.1, 0.0])
    adv = torch.tensor([1.0, -1.0, 2.0])
    loss, m = flow_grpo_loss(
        log_probs=lp,
        old_log_probs=lp_old,
        advantages=adv,
        clip_range=1e-4,
        kl=torch.tensor([1.0, 2.0, 3.0]),
        kl_coef=0.04,
    )
    expected = _ppo_reference(torch.exp(lp), adv, 1e-4) + 0.04 * 2.0
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert m["clip_frac"] == pytest.approx(2 / 3)


def test_nft_loss_with_reward_one_is_the_self_normalised_x_loss():
    g = torch.Generator().manual_seed(2)
    x0, eps, v_old = (torch.randn(3, 2, 2, 2, generator=g) for _ in range(3))
    v = (v_old + 0.1 * torch.randn(3, 2, 2, 2, generator=g)).requires_grad_(True)
    t = torch.tensor([0.2, 0.5, 0.9])
    loss, _ = nft_loss(v_theta=v, v_old=v_old, x0=x0, eps=eps, t=t, reward_weight=torch.ones(3), beta=1.0)
    plain = -elbo_surrogate(v_pred=v, x0=x0, eps=eps, t=t).surrogate.mean()
    torch.testing.assert_close(loss, plain)
    # r = 0 trains the negative policy: v- = 2 v_old - v, its x-loss
    loss0, _ = nft_loss(v_theta=v, v_old=v_old, x0=x0, eps=eps, t=t, reward_weight=torch.zeros(3), beta=1.0)
    neg = -elbo_surrogate(v_pred=2 * v_old - v, x0=x0, eps=eps, t=t).surrogate.mean()
    torch.testing.assert_close(loss0, neg)


def test_nft_gradients_of_positive_and_negative_branches_oppose_at_old_policy():
    g = torch.Generator().manual_seed(3)
    x0, eps, v_old = (torch.randn(2, 1, 2, 2, generator=g) for _ in range(3))
    t = torch.tensor([0.3, 0.6])
    grads = []
    for r in (1.0, 0.0):
        v = v_old.clone().requires_grad_(True)
        loss, _ = nft_loss(v_theta=v, v_old=v_old, x0=x0, eps=eps, t=t, reward_weight=torch.full((2,), r))
        grads.append(torch.autograd.grad(loss, v)[0])
    torch.testing.assert_close(grads[0], -grads[1])


def test_ratio_metrics_report_the_ratios_spread() -> None:
    from vgrpo.losses import ratio_metrics

    m = ratio_metrics(torch.tensor([0.5, 1.0, 1.5]), clip_range=0.2)
    assert m["ratio_std"] == pytest.approx((0.5 / 3) ** 0.5)  # population std: sqrt((0.25 + 0 + 0.25) / 3)
    assert ratio_metrics(torch.ones(4), clip_range=None)["ratio_std"] == 0.0
