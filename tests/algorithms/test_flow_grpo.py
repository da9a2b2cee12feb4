"""Flow-GRPO's KL reference in a stage that starts from an earlier stage's adapter: the base model, not the adapter."""

import pytest
import torch

from tests.algorithms.helpers import GROUP, PROMPTS, make_config, make_policy, prepared
from vgrpo.algorithms.config import FlowGRPOConfig
from vgrpo.models import SD3Velocity
from vgrpo.models.tiny import TINY_LATENT_SHAPE, tiny_conditioning, tiny_sd3_transformer

N = PROMPTS * GROUP


def _velocities(policy: torch.nn.Module) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    x, t = torch.randn(N, *TINY_LATENT_SHAPE, generator=g), torch.rand(N, generator=g)
    with torch.no_grad():
        return policy(x, t, tiny_conditioning(PROMPTS).repeat_interleave(GROUP))


def test_kl_reference_is_the_base_model_when_the_stage_starts_from_an_adapter() -> None:
    config = make_config({"name": "flow_grpo", "kl_coef": 0.04, "timestep_fraction": 0.2})
    assert isinstance(config.algorithm, FlowGRPOConfig) and config.algorithm.reference == "base"
    policy = make_policy(config)  # LoRA B moved off zero: the adapter an earlier stage left
    base = _velocities(SD3Velocity(tiny_sd3_transformer()))  # the same seed: the pretrained weights alone
    adapted = _velocities(policy)
    assert (adapted - base).abs().max() > 1e-3  # the starting adapter is not the base

    algorithm, batch = prepared(config, policy)
    assert algorithm.reference is not None
    with algorithm.reference.swapped_in():
        assert torch.equal(_velocities(policy), base)  # B = 0 adds exact zeros to every base layer
    assert torch.equal(_velocities(policy), adapted)  # the live adapter is back
    kl_base = algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=0)["kl"]
    assert kl_base > 0  # held to the base from the first step

    start = make_config({"name": "flow_grpo", "kl_coef": 0.04, "timestep_fraction": 0.2, "reference": "start"})
    algorithm, batch = prepared(start, policy)
    assert algorithm.reference is not None
    with algorithm.reference.swapped_in():
        assert torch.equal(_velocities(policy), adapted)
    policy.zero_grad(set_to_none=True)
    assert algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=0)["kl"] == 0.0


def test_base_reference_of_a_full_fine_tune_is_the_loaded_weights() -> None:
    config = make_config({"name": "flow_grpo", "kl_coef": 0.04}, lora=None)
    policy = make_policy(config)
    algorithm, _ = prepared(config, policy)
    assert algorithm.reference is not None
    live = [p.detach().clone() for p in policy.parameters() if p.requires_grad]
    assert len(algorithm.reference.values) == len(live)
    assert all(torch.equal(a, b) for a, b in zip(algorithm.reference.values, live, strict=True))


@pytest.mark.parametrize("name", ["flow_grpo", "mixgrpo"])
def test_no_reference_without_a_kl(name: str) -> None:
    extra = {"window_size": 2} if name == "mixgrpo" else {}
    config = make_config({"name": name, "kl_coef": 0.0, **extra})
    algorithm, _ = prepared(config, make_policy(config))
    assert algorithm.reference is None and algorithm.snapshots() == {}
