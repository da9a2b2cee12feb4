"""Each algorithm's config says how many weight copies it keeps (what the preflight sizes checkpoints by), and the
built algorithm keeps exactly that many; each algorithm's config refuses a rollout it cannot use."""

from __future__ import annotations

from typing import Any

import pytest

from tests.algorithms.helpers import make_config, make_policy
from vgrpo.algorithms import build_algorithm
from vgrpo.errors import ConfigError
from vgrpo.models.tiny import TINY_LATENT_SHAPE


@pytest.mark.parametrize(
    ("algorithm", "copies"),
    [
        ({"name": "vgrpo"}, 0),
        ({"name": "vgrpo", "kl_coef": 0.3}, 0),  # the KL to the behaviour policy needs no stored copy
        ({"name": "vgrpo", "ref_kl_coef": 20.0}, 1),
        ({"name": "naive_elbo"}, 0),
        ({"name": "flow_grpo", "kl_coef": 0.04}, 1),
        ({"name": "flow_grpo", "kl_coef": 0.0}, 0),
        ({"name": "mixgrpo", "window_size": 2, "shift_interval": 2}, 0),
        ({"name": "mixgrpo", "window_size": 2, "shift_interval": 2, "kl_coef": 0.01}, 1),
        ({"name": "diffusion_nft"}, 1),
    ],
)
def test_the_config_counts_the_weight_copies_the_algorithm_keeps(algorithm: dict[str, Any], copies: int) -> None:
    config = make_config(algorithm)
    policy = make_policy(config)
    built = build_algorithm(config, policy=policy, latent_shape=TINY_LATENT_SHAPE)
    assert config.algorithm.weight_copies() == copies == len(built.snapshots())


@pytest.mark.parametrize(
    ("algorithm", "message"),
    [
        ({"name": "vgrpo", "n_mc": 7}, "algorithm.n_mc=7 stratified timesteps need rollout.num_steps >= n_mc"),
        ({"name": "diffusion_nft", "n_mc": 7, "timestep_sampling": "stratified"}, "algorithm.n_mc=7"),
        ({"name": "mixgrpo", "window_size": 7}, "algorithm.window_size=7 > rollout.num_steps=6"),
    ],
)
def test_the_algorithm_refuses_a_rollout_it_cannot_use(algorithm: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_config(algorithm)


def test_a_rollout_with_enough_steps_is_accepted() -> None:
    assert make_config({"name": "vgrpo", "n_mc": 6}).algorithm.n_mc == 6
    assert make_config({"name": "vgrpo", "n_mc": 7, "timestep_sampling": "uniform"}).algorithm.n_mc == 7
