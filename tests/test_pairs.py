import pytest
import torch

from vgrpo.flow import timestep_grid
from vgrpo.pairs import draw_pairs, stratified_timesteps


def _draw(share, sampling="stratified", n_mc=4, seed=0):
    return draw_pairs(
        num_prompts=3,
        group_size=4,
        n_mc=n_mc,
        latent_shape=(2, 3, 3),
        share=share,
        timestep_sampling=sampling,
        sigmas=timestep_grid(12, shift=3.0),
        generator=torch.Generator().manual_seed(seed),
    )


def test_stratified_draws_land_one_per_chunk():
    sigmas = timestep_grid(12, shift=3.0)
    t = stratified_timesteps(sigmas, 4, 500, torch.Generator().manual_seed(0))
    grid = sigmas[:-1]
    chunks = torch.tensor_split(grid, 4)
    for j, chunk in enumerate(chunks):
        assert torch.isin(t[:, j], chunk).all(), f"column {j} left its chunk"
        assert set(t[:, j].tolist()) == set(chunk.tolist())  # every entry of the chunk gets drawn
    assert (t[:, :-1] > t[:, 1:]).all()  # chunks are ordered from noise to data


def test_stratified_needs_enough_grid_steps():
    with pytest.raises(ValueError, match="n_mc=11"):
        stratified_timesteps(timestep_grid(10), 11, 1, torch.Generator())


def test_share_scope_sets_rows_and_lookup():
    assert _draw("batch").t.shape == (1, 4)
    assert _draw("group").t.shape == (3, 4)
    assert _draw("none").t.shape == (12, 4)
    idx = torch.arange(12)
    group = _draw("group")
    for j in range(4):
        t = group.timesteps(j, idx).reshape(3, 4)
        assert torch.all(t == t[:, :1]), "samples of one prompt share their pair"
        noise = group.noise(j, idx).reshape(3, 4, -1)
        assert torch.all(noise == noise[:, :1])
    batch = _draw("batch")
    assert torch.all(batch.noise(2, idx) == batch.eps[0, 2])
    none = _draw("none")
    assert not torch.all(none.noise(0, idx)[0] == none.noise(0, idx)[1])


def test_uniform_and_logit_normal_draws_are_in_range_and_seeded():
    for sampling in ("uniform", "logit_normal"):
        a, b = _draw("none", sampling, seed=1), _draw("none", sampling, seed=1)
        assert torch.equal(a.t, b.t) and torch.equal(a.eps, b.eps)
        assert (a.t > 0).all() and (a.t <= 1).all()
    ln = draw_pairs(
        num_prompts=1,
        group_size=2,
        n_mc=4000,
        latent_shape=(1,),
        share="batch",
        timestep_sampling="logit_normal",
        sigmas=timestep_grid(4),
        generator=torch.Generator().manual_seed(0),
    )
    assert ln.t.mean().item() == pytest.approx(0.5, abs=0.02)  # sigmoid(N(0, 1)) is symmetric about 1/2


def test_draw_pairs_rejects_bad_options():
    with pytest.raises(ValueError, match="share"):
        _draw("everything")
    with pytest.raises(ValueError, match="n_mc"):
        _draw("batch", n_mc=0)
