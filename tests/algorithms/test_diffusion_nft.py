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
