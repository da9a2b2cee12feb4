"""DiffusionNFT's preparation diagnostics."""

from __future__ import annotations

import pytest
import torch

from tests.algorithms.helpers import make_config, make_policy, prepared


def test_the_reward_weights_share_at_0_or_1_is_the_share_of_advantages_cut_at_adv_max() -> None:
    config = make_config({"name": "diffusion_nft", "adv_max": 5.0})
    # r = clip(A / 5 / 2 + 0.5, 0, 1) = 0, 0, 0.5, 1, 0.75, 0.6: three of six at an end
    advantages = torch.tensor([-10.0, -5.0, 0.0, 5.0, 2.5, 1.0])
    _, batch = prepared(config, make_policy(config), advantages)
    assert batch.metrics["nft/reward_weight_saturated_frac"] == pytest.approx(0.5)
    assert batch.metrics["nft/reward_weight_mean"] == pytest.approx(2.85 / 6)


@pytest.mark.parametrize(
    ("iteration", "decay"),
    [(0, 0.0), (37, 0.0), (38, 0.0075), (40, 0.0375), (100, 0.9375), (104, 0.9975), (105, 0.999), (180, 0.999)],
)
def test_the_old_policys_decay_stays_0_through_the_flat_start_then_ramps_to_its_max(
    iteration: int, decay: float
) -> None:
    """DiffusionNFT's OCR schedule (its decay type 2: 0 for 75 optimiser steps, then 0.0075 a step up to 0.999) at
    two optimiser steps an iteration: flat 37.5 iterations, 0.015 an iteration."""
    config = make_config(
        {"name": "diffusion_nft", "ema_decay_flat": 37.5, "ema_decay_rate": 0.015, "ema_decay_max": 0.999}
    )
    algorithm, _ = prepared(config, make_policy(config))
    official = min(max(0, 2 * iteration - 75) * 0.0075, 0.999)
    assert algorithm.end_iteration(make_policy(config), iteration)["nft/ema_decay"] == pytest.approx(decay)
    assert decay == pytest.approx(official)


def test_without_a_flat_start_the_decay_is_the_rate_times_the_iteration() -> None:
    config = make_config({"name": "diffusion_nft", "ema_decay_rate": 0.002})
    algorithm, _ = prepared(config, make_policy(config))
    assert [algorithm.end_iteration(make_policy(config), i)["nft/ema_decay"] for i in (0, 3, 400)] == [0.0, 0.006, 0.5]


def test_a_config_without_a_flat_start_dumps_as_before_the_option_existed() -> None:
    """Recorded cells and stage fingerprints of DiffusionNFT stay as they were (FrozenConfig.LATER_OPTIONS)."""
    from vgrpo.algorithms.config import DiffusionNFTConfig

    assert "ema_decay_flat" not in DiffusionNFTConfig().model_dump(mode="json")
    assert DiffusionNFTConfig(ema_decay_flat=37.5).model_dump(mode="json")["ema_decay_flat"] == 37.5
