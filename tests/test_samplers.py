import pytest
import torch

from vgrpo.flow import timestep_grid
from vgrpo.policy import Conditioning
from vgrpo.samplers import (
    euler_ode_sample,
    flow_grpo_sde_std,
    gaussian_log_prob,
    mixgrpo_window_start,
    sde_sample,
    sde_step,
    window_mask,
)


class LinearVelocity(torch.nn.Module):
    """v = a * x + b * t + mean(cond): simple, deterministic, conditioning-dependent."""

    def forward(self, x, t, cond):
        c = cond.prompt_embeds.mean(dim=(1, 2)).reshape(-1, 1, 1, 1)
        return 0.5 * x + t.reshape(-1, 1, 1, 1) + c


def _cond(n: int) -> Conditioning:
    return Conditioning(prompt_embeds=torch.arange(n, dtype=torch.float32).reshape(n, 1, 1).expand(n, 2, 3) / 10)


def test_euler_ode_sample_matches_hand_written_loop():
    model, cond = LinearVelocity(), _cond(3)
    noise = torch.randn(3, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    sigmas = timestep_grid(5, shift=3.0)
    x = noise.clone()
    for k in range(5):
        t = torch.full((3,), float(sigmas[k]))
        x = x + model(x, t, cond) * float(sigmas[k + 1] - sigmas[k])
    torch.testing.assert_close(euler_ode_sample(model, noise, cond, sigmas), x, rtol=0, atol=1e-6)


def test_euler_ode_on_exact_velocity_transports_noise_to_data():
    x0 = torch.randn(2, 1, 3, 3, generator=torch.Generator().manual_seed(1))
    noise = torch.randn(2, 1, 3, 3, generator=torch.Generator().manual_seed(2))

    class Straight(torch.nn.Module):
        def forward(self, x, t, cond):
            return noise - x0  # the straight path's constant velocity

    out = euler_ode_sample(Straight(), noise, _cond(2), timestep_grid(7, shift=3.0))
    torch.testing.assert_close(out, x0, rtol=0, atol=1e-5)


def test_sde_step_log_prob_equals_torch_normal():
    g = torch.Generator().manual_seed(3)
    x_t, v, noise = (torch.randn(4, 2, 3, 3, generator=g) for _ in range(3))
    t = torch.tensor([1.0, 0.9, 0.5, 0.2])
    t_next = torch.tensor([0.9, 0.7, 0.4, 0.1])
    step = sde_step(v=v, x_t=x_t, t=t, t_next=t_next, noise_level=0.7, t_cap=0.9, step_noise=noise)
    expected = torch.distributions.Normal(step.mean, step.std.reshape(-1, 1, 1, 1)).log_prob(step.x_next)
    torch.testing.assert_close(step.log_prob, expected.mean(dim=(1, 2, 3)), rtol=1e-5, atol=1e-5)


def test_sde_step_mean_and_std_follow_flow_grpo_formula():
    x_t, v = torch.full((1, 1, 1, 1), 2.0), torch.full((1, 1, 1, 1), -1.0)
    t, t_next = torch.tensor([0.5]), torch.tensor([0.4])
    step = sde_step(v=v, x_t=x_t, t=t, t_next=t_next, noise_level=0.7, t_cap=0.9, step_noise=torch.zeros(1, 1, 1, 1))
    sigma = 0.7 * (0.5 / 0.5) ** 0.5
    dt = -0.1
    mean = 2.0 * (1 + sigma**2 * dt / (2 * 0.5)) + (-1.0) * (1 + sigma**2 * 0.5 / (2 * 0.5)) * dt
    assert step.mean.item() == pytest.approx(mean, rel=1e-6)
    assert step.std.item() == pytest.approx(sigma * 0.1**0.5, rel=1e-6)
    assert step.x_next.item() == pytest.approx(mean, rel=1e-6)


def test_sde_std_at_t_one_uses_next_grid_value():
    std = flow_grpo_sde_std(torch.tensor([1.0]), noise_level=0.7, t_cap=0.9)
    assert std.item() == pytest.approx(0.7 * (1.0 / 0.1) ** 0.5, rel=1e-6)
    assert torch.isfinite(std).all()


def test_sde_step_rescoring_reproduces_sampled_log_prob():
    g = torch.Generator().manual_seed(4)
    x_t, v, noise = (torch.randn(3, 2, 2, 2, generator=g) for _ in range(3))
    t, t_next = torch.full((3,), 0.6), torch.full((3,), 0.5)
    sampled = sde_step(v=v, x_t=x_t, t=t, t_next=t_next, noise_level=0.7, t_cap=0.9, step_noise=noise)
    rescored = sde_step(v=v, x_t=x_t, t=t, t_next=t_next, noise_level=0.7, t_cap=0.9, x_next=sampled.x_next)
    torch.testing.assert_close(rescored.log_prob, sampled.log_prob, rtol=0, atol=0)
    with pytest.raises(ValueError, match="exactly one"):
        sde_step(v=v, x_t=x_t, t=t, t_next=t_next, noise_level=0.7, t_cap=0.9)


def test_sde_sample_is_ode_outside_the_window_and_deterministic():
    model, cond = LinearVelocity(), _cond(2)
    g = torch.Generator().manual_seed(5)
    noise = torch.randn(2, 1, 2, 2, generator=g)
    sigmas = timestep_grid(6, shift=3.0)
    step_noise = torch.randn(2, 6, 1, 2, 2, generator=g)
    mask = window_mask(6, 2, 2)
    traj = sde_sample(model, noise, cond, sigmas, noise_level=0.7, sde_steps=mask, step_noise=step_noise)
    assert traj.latents.shape == (2, 7, 1, 2, 2) and traj.log_probs.shape == (2, 6)
    assert torch.all(traj.log_probs[:, ~mask] == 0) and torch.all(traj.log_probs[:, mask] != 0)
    # The first two steps are ODE: they equal the Euler sampler on the truncated grid.
    torch.testing.assert_close(traj.latents[:, 2], euler_ode_sample(model, noise, cond, sigmas[:3]))
    again = sde_sample(model, noise, cond, sigmas, noise_level=0.7, sde_steps=mask, step_noise=step_noise)
    assert torch.equal(again.latents, traj.latents)
    # Splitting the batch does not change a sample: randomness is passed in, not drawn inside.
    half = sde_sample(
        model,
        noise[:1],
        cond.index(torch.tensor([0])),
        sigmas,
        noise_level=0.7,
        sde_steps=mask,
        step_noise=step_noise[:1],
    )
    torch.testing.assert_close(half.latents[0], traj.latents[0])


def test_mixgrpo_window_advances_then_rolls_back():
    starts = [mixgrpo_window_start(it, num_steps=6, window_size=4, shift_interval=25) for it in range(0, 100, 25)]
    assert starts == [0, 1, 2, 0]
    with pytest.raises(ValueError, match="does not fit"):
        window_mask(6, 3, 4)


def test_gaussian_log_prob_of_mean_is_minus_log_std_minus_half_log_two_pi():
    x = torch.zeros(2, 3)
    lp = gaussian_log_prob(x, x, torch.tensor([1.0, 2.0]))
    torch.testing.assert_close(lp, torch.tensor([-0.9189385, -0.9189385 - 0.6931472]))
