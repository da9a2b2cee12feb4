import pytest
import torch

from vgrpo.flow import interpolate
from vgrpo.surrogate import elbo_surrogate, prediction_error


def _inputs(seed=0, n=4):
    g = torch.Generator().manual_seed(seed)
    x0, eps, v = (torch.randn(n, 2, 3, 3, generator=g) for _ in range(3))
    t = torch.tensor([0.1, 0.4, 0.7, 0.95])[:n]
    return x0, eps, v, t


def test_x_surrogate_matches_hand_written_formula():
    x0, eps, v, t = _inputs()
    z = (1 - t.reshape(-1, 1, 1, 1)) * x0 + t.reshape(-1, 1, 1, 1) * eps
    x0_hat = z - t.reshape(-1, 1, 1, 1) * v
    err = x0_hat - x0
    expected = -(err**2).mean(dim=(1, 2, 3)) / err.abs().mean(dim=(1, 2, 3)).clamp(min=1e-5)
    terms = elbo_surrogate(v_pred=v, x0=x0, eps=eps, t=t)
    torch.testing.assert_close(terms.surrogate, expected)
    torch.testing.assert_close(terms.x0_hat, x0_hat)


def test_prediction_spaces_scale_the_velocity_residual_by_t():
    x0, eps, v, t = _inputs()
    v_err = prediction_error(v_pred=v, x0=x0, eps=eps, t=t, prediction="v")
    x_err = prediction_error(v_pred=v, x0=x0, eps=eps, t=t, prediction="x")
    e_err = prediction_error(v_pred=v, x0=x0, eps=eps, t=t, prediction="eps")
    torch.testing.assert_close(x_err, -t.reshape(-1, 1, 1, 1) * v_err)
    torch.testing.assert_close(e_err, (1 - t).reshape(-1, 1, 1, 1) * v_err)
    with pytest.raises(ValueError, match="prediction"):
        prediction_error(v_pred=v, x0=x0, eps=eps, t=t, prediction="score")  # type: ignore[arg-type]


def test_self_normalisation_is_detached_and_scale_free():
    x0, eps, v, t = _inputs()
    v = v.clone().requires_grad_(True)
    s = elbo_surrogate(v_pred=v, x0=x0, eps=eps, t=t).surrogate
    (grad,) = torch.autograd.grad(s.sum(), v)
    err = prediction_error(v_pred=v.detach(), x0=x0, eps=eps, t=t, prediction="x")
    scale = err.abs().mean(dim=(1, 2, 3)).reshape(-1, 1, 1, 1)
    # d/dv of -mean(err^2)/sg(scale) with err = x0_hat - x0 and d err/d v = -t
    expected = (2 * err * t.reshape(-1, 1, 1, 1) / err[0].numel()) / scale
    torch.testing.assert_close(grad, expected)
    # Doubling the residual doubles the self-normalised surrogate (instead of quadrupling it).
    v_far = 2 * v.detach() - (eps - x0)  # the residual v - v_true doubles
    s_far = elbo_surrogate(v_pred=v_far, x0=x0, eps=eps, t=t).surrogate
    torch.testing.assert_close(s_far, 2 * s.detach())
    raw = elbo_surrogate(v_pred=v.detach(), x0=x0, eps=eps, t=t, self_normalize=False).surrogate
    raw_far = elbo_surrogate(v_pred=v_far, x0=x0, eps=eps, t=t, self_normalize=False).surrogate
    torch.testing.assert_close(raw_far, 4 * raw)


def test_surrogate_is_zero_for_the_exact_velocity_and_never_divides_by_zero():
    x0, eps, _, t = _inputs()
    s = elbo_surrogate(v_pred=eps - x0, x0=x0, eps=eps, t=t).surrogate
    assert torch.isfinite(s).all()
    torch.testing.assert_close(s, torch.zeros(4), atol=1e-6, rtol=0)


def test_identical_outputs_with_shared_pair_have_identical_surrogates():
    x0, eps, v, t = _inputs()
    x0 = x0[:1].expand(4, -1, -1, -1)
    eps = eps[:1].expand(4, -1, -1, -1)
    t = t[:1].expand(4)
    v = v[:1].expand(4, -1, -1, -1)
    s = elbo_surrogate(v_pred=v, x0=x0, eps=eps, t=t).surrogate
    assert torch.all(s == s[0])
    assert torch.equal(interpolate(x0, eps, t)[0], interpolate(x0, eps, t)[3])
