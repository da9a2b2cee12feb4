import math

import pytest
import torch

from vgrpo.flow import (
    eps_from_velocity,
    interpolate,
    resolution_shift_mu,
    shift_timesteps,
    time_shift_exponential,
    timestep_grid,
    velocity_from_eps,
    velocity_from_x0,
    velocity_target,
    x0_from_velocity,
)


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(5, 3, 4, 4, generator=g, dtype=torch.float64)
    eps = torch.randn(5, 3, 4, 4, generator=g, dtype=torch.float64)
    v_hat = torch.randn(5, 3, 4, 4, generator=g, dtype=torch.float64)
    t = torch.tensor([0.05, 0.3, 0.5, 0.8, 1.0], dtype=torch.float64)
    return x0, eps, v_hat, t


def test_interpolate_endpoints_are_data_and_noise():
    x0, eps, _, _ = _batch()
    assert torch.equal(interpolate(x0, eps, torch.zeros(5, dtype=torch.float64)), x0)
    assert torch.equal(interpolate(x0, eps, torch.ones(5, dtype=torch.float64)), eps)


def test_x0_prediction_error_equals_t_squared_velocity_error():
    x0, eps, v_hat, t = _batch()
    x_t = interpolate(x0, eps, t)
    lhs = ((x0_from_velocity(x_t, v_hat, t) - x0) ** 2).sum(dim=(1, 2, 3))
    rhs = t**2 * ((v_hat - velocity_target(x0, eps)) ** 2).sum(dim=(1, 2, 3))
    torch.testing.assert_close(lhs, rhs, rtol=1e-12, atol=1e-12)


def test_eps_prediction_error_equals_one_minus_t_squared_velocity_error():
    x0, eps, v_hat, t = _batch()
    x_t = interpolate(x0, eps, t)
    lhs = ((eps_from_velocity(x_t, v_hat, t) - eps) ** 2).sum(dim=(1, 2, 3))
    rhs = (1 - t) ** 2 * ((v_hat - velocity_target(x0, eps)) ** 2).sum(dim=(1, 2, 3))
    torch.testing.assert_close(lhs, rhs, rtol=1e-12, atol=1e-12)


def test_true_velocity_recovers_x0_and_eps_exactly():
    x0, eps, _, t = _batch()
    x_t = interpolate(x0, eps, t)
    v = velocity_target(x0, eps)
    torch.testing.assert_close(x0_from_velocity(x_t, v, t), x0, rtol=0, atol=1e-12)
    torch.testing.assert_close(eps_from_velocity(x_t, v, t), eps, rtol=0, atol=1e-12)


def test_conversions_invert_each_other():
    x0, eps, v_hat, t = _batch()
    x_t = interpolate(x0, eps, t)
    inner = slice(0, 4)  # t = 1 makes the eps inverse singular
    torch.testing.assert_close(velocity_from_x0(x_t, x0_from_velocity(x_t, v_hat, t), t), v_hat)
    torch.testing.assert_close(
        velocity_from_eps(x_t[inner], eps_from_velocity(x_t, v_hat, t)[inner], t[inner]), v_hat[inner]
    )


def test_static_shift_fixes_endpoints_and_matches_closed_form():
    t = torch.tensor([0.0, 0.25, 0.5, 1.0], dtype=torch.float64)
    shifted = shift_timesteps(t, 3.0)
    assert shifted[0] == 0 and shifted[-1] == 1
    assert shifted[2].item() == pytest.approx(3 * 0.5 / (1 + 2 * 0.5))
    with pytest.raises(ValueError, match="shift"):
        shift_timesteps(t, 0.0)


def test_uniform_grid_is_the_scheduler_given_uniform_sigmas() -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    # The uniform grid is the scheduler's when it is handed sigmas = linspace(1, 1/T, T) (FluxPipeline does, with
    # its mu); StableDiffusion3Pipeline hands it none, which is the "diffusers" grid (the next test).
    scheduler.set_timesteps(sigmas=[1 - k / 10 for k in range(10)])
    torch.testing.assert_close(timestep_grid(10, shift=3.0), scheduler.sigmas.float(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("num_steps", [1, 2, 10, 16, 25, 40, 50])
@pytest.mark.parametrize("shift", [1.0, 2.2247, 3.0, 7.5])
def test_diffusers_grid_is_the_schedulers_own_schedule_bit_for_bit(num_steps: int, shift: float) -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(num_steps)  # StableDiffusion3Pipeline's (and Flow-GRPO's SD3 sampler's) call
    assert torch.equal(timestep_grid(num_steps, shift=shift, schedule="diffusers"), scheduler.sigmas)
    dynamic = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    dynamic.set_timesteps(num_steps, mu=math.log(shift))
    assert torch.equal(timestep_grid(num_steps, mu=math.log(shift), schedule="diffusers"), dynamic.sigmas)


def test_diffusers_grid_ends_with_a_short_step_where_the_uniform_grid_does_not() -> None:
    diffusers_grid, uniform = timestep_grid(10, shift=3.0, schedule="diffusers"), timestep_grid(10, shift=3.0)
    # shift(linspace(1, shift(1e-3), 10)): its last value is the training grid's smallest sigma shifted twice.
    smallest = 3 * 1e-3 / (1 + 2 * 1e-3)
    assert diffusers_grid[-2].item() == pytest.approx(3 * smallest / (1 + 2 * smallest), rel=1e-6)
    assert diffusers_grid[-2].item() == pytest.approx(0.0089, abs=5e-5)
    assert uniform[-2].item() == pytest.approx(0.25, abs=1e-7)
    assert diffusers_grid[0] == uniform[0] == 1 and diffusers_grid[-1] == uniform[-1] == 0
    with pytest.raises(ValueError, match="schedule must be"):
        timestep_grid(10, shift=3.0, schedule="karras")  # type: ignore[arg-type]


def test_timestep_grid_matches_diffusers_flux_dynamic_shift():
    from diffusers import FlowMatchEulerDiscreteScheduler

    mu = resolution_shift_mu(4096)
    assert mu == pytest.approx(1.15)
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    num = 8
    scheduler.set_timesteps(num, sigmas=[1 - k / num for k in range(num)], mu=mu)
    torch.testing.assert_close(timestep_grid(num, mu=mu), scheduler.sigmas.float(), rtol=0, atol=1e-6)


def test_time_shift_exponential_closed_form():
    t = torch.tensor([0.5], dtype=torch.float64)
    expected = math.exp(0.7) / (math.exp(0.7) + 1.0)
    assert time_shift_exponential(t, 0.7).item() == pytest.approx(expected)


def test_timestep_grid_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_steps"):
        timestep_grid(0)
    with pytest.raises(ValueError, match="not both"):
        timestep_grid(4, shift=3.0, mu=1.0)
