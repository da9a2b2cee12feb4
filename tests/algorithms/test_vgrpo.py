import pytest
import torch

from tests.algorithms.helpers import grads, make_config, make_policy, prepared
from vgrpo.algorithms.vgrpo import VGRPO, surrogate_cv
from vgrpo.flow import interpolate
from vgrpo.surrogate import elbo_surrogate

N = 6


def _reinforce_grads(policy, batch, n_mc):
    """Independent REINFORCE gradient: -mean_i A_i grad(mean_j s_ij), written out by hand."""
    pairs = batch.payload.pairs
    policy.zero_grad(set_to_none=True)
    s = []
    for j in range(n_mc):
        t = pairs.t[0, j].expand(N)
        eps = pairs.eps[0, j].expand_as(batch.samples)
        z = interpolate(batch.samples, eps, t)
        v = policy(z, t, batch.cond)
        s.append(elbo_surrogate(v_pred=v, x0=batch.samples, eps=eps, t=t).surrogate)
    objective = -(batch.advantages * torch.stack(s, dim=1).mean(dim=1)).mean()
    objective.backward()
    return grads(policy)


def test_first_step_gradient_equals_reinforce_on_the_surrogate():
    config = make_config({"name": "vgrpo", "n_mc": 3, "clip_range": 0.01})
    policy = make_policy(config)
    algorithm, batch = prepared(config, policy)
    policy.zero_grad(set_to_none=True)
    metrics = algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=0)
    ours = grads(policy)
    reference = _reinforce_grads(policy, batch, 3)
    assert metrics["ratio_min"] == metrics["ratio_max"] == 1.0 and metrics["clip_frac"] == 0.0
    assert sum(g.abs().sum() for g in reference) > 0
    for a, b in zip(ours, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)


def test_full_graph_ratio_is_exactly_one_at_the_first_step():
    config = make_config({"name": "vgrpo", "n_mc": 2, "memory_bounded": False}, optim={"micro_batch_size": 4})
    policy = make_policy(config)
    algorithm, batch = prepared(config, policy)
    metrics = algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=0)
    assert metrics["ratio_min"] == 1.0 and metrics["ratio_max"] == 1.0


def test_memory_bounded_update_equals_full_graph_with_clip_and_kl_active():
    algo_cfg = {"name": "vgrpo", "n_mc": 3, "clip_range": 0.002, "kl_coef": 0.3, "ref_kl_coef": 0.7}
    config = make_config(algo_cfg, optim={"micro_batch_size": 4})
    policy = make_policy(config)
    algorithm, batch = prepared(config, policy)
    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=20.0)
    policy.zero_grad(set_to_none=True)
    algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=0)
    optimizer.step()  # move away from theta_old: ratios != 1, clip and KL now act

    policy.zero_grad(set_to_none=True)
    bounded = algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=1)
    g_bounded = grads(policy)
    full_graph = VGRPO(
        make_config({**algo_cfg, "memory_bounded": False}).algorithm,  # type: ignore[arg-type]
        policy=policy,
        sigmas=algorithm.sigmas,
        group_size=3,
        latent_shape=algorithm.latent_shape,
        rollout_micro_batch=4,
        train_micro_batch=4,
    )
    policy.zero_grad(set_to_none=True)
    full = full_graph.accumulate_gradients(policy, batch, torch.arange(N), step=1)
    g_full = grads(policy)

    assert 0 < bounded["clip_frac"] < 1, "the test must have clipped and unclipped samples"
    assert bounded["kl"] > 0 and bounded["kl_ref"] > 0
    assert bounded["kl_ref"] == pytest.approx(full["kl_ref"], rel=1e-5)
    assert bounded["loss"] == pytest.approx(full["loss"], rel=1e-5)
    assert bounded["ratio_max"] == pytest.approx(full["ratio_max"], rel=1e-6)
    scale = max(g.abs().max().item() for g in g_full)
    for a, b in zip(g_bounded, g_full, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6 * max(scale, 1.0))


def test_reference_kl_is_zero_at_the_start_and_pulls_back_to_the_starting_weights():
    config = make_config({"name": "vgrpo", "n_mc": 2, "ref_kl_coef": 1.0})
    policy = make_policy(config)
    zero = torch.zeros(N)
    algorithm, batch = prepared(config, policy, zero)
    start = [p.detach().clone() for p in policy.parameters() if p.requires_grad]
    assert set(algorithm.snapshots()) == {"reference"}  # saved with checkpoints, so a resumed run keeps it
    policy.zero_grad(set_to_none=True)
    metrics = algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=0)
    assert metrics["kl_ref"] == 0.0 and all(g.abs().max() == 0 for g in grads(policy))

    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # move away from the reference, then prepare a batch under the moved weights
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    batch = algorithm.prepare(policy, algorithm.rollout(policy, batch.cond, batch.samples, g, 1), batch.cond, zero, g)
    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.5)
    distances, kls = [], []
    for step in range(3):  # zero advantages: the reference KL is the whole objective
        policy.zero_grad(set_to_none=True)
        kls.append(algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=step)["kl_ref"])
        optimizer.step()
        distances.append(
            sum(
                (p - s).pow(2).sum().item()
                for p, s in zip([p for p in policy.parameters() if p.requires_grad], start, strict=True)
            )
        )
    assert kls[0] > 0 and kls[2] < kls[1] < kls[0]
    assert distances[2] < distances[0]


def test_flipping_advantages_flips_the_gradient():
    config = make_config({"name": "vgrpo", "n_mc": 2})
    policy = make_policy(config)
    adv = torch.tensor([1.2, -0.4, -0.8, 0.9, 0.1, -1.0])
    algorithm, batch = prepared(config, policy, adv)
    policy.zero_grad(set_to_none=True)
    algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=0)
    pos = grads(policy)
    batch.advantages = -adv
    policy.zero_grad(set_to_none=True)
    algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=0)
    for a, b in zip(pos, grads(policy), strict=True):
        torch.testing.assert_close(a, -b, rtol=1e-6, atol=1e-9)


def test_shared_pairs_make_surrogates_of_identical_outputs_identical():
    for share, identical in (("batch", True), ("group", True), ("none", False)):
        config = make_config({"name": "vgrpo", "n_mc": 2, "share": share}, optim={"micro_batch_size": N})
        policy = make_policy(config)
        algorithm, batch = prepared(config, policy)
        batch.samples[1] = batch.samples[0]  # two samples of prompt 0 with the same output
        s, _ = algorithm.current_surrogates(policy, batch.samples, batch.cond, batch.payload.pairs, torch.arange(N))
        assert torch.equal(s[0], s[1]) is identical, share


def test_naive_elbo_switches_every_technique_off():
    config = make_config({"name": "naive_elbo"})
    algo = config.algorithm
    assert (algo.share, algo.timestep_sampling, algo.prediction, algo.self_normalize) == (
        "none",
        "uniform",
        "v",
        False,
    )
    policy = make_policy(config)
    algorithm, batch = prepared(config, policy)
    assert batch.payload.pairs.t.shape == (N, 4)
    assert algorithm.name == "vgrpo" and batch.metrics["surrogate/cv"] > 0


def test_surrogate_cv_statistics_by_hand():
    s = torch.tensor([[-1.0], [-3.0], [-2.0], [-2.0]])
    m = surrogate_cv(s, group_size=2)
    mags = torch.tensor([1.0, 3.0, 2.0, 2.0])
    assert m["surrogate/cv"] == pytest.approx((mags.std(unbiased=False) / mags.mean()).item())
    assert m["surrogate/cv_within_group"] == pytest.approx((1.0 / 2.0 + 0.0) / 2)


def test_reference_kl_to_the_base_holds_a_stage_that_starts_from_an_adapter_to_the_base():
    """``ref_kl_reference: base``: the reference is the adapter's base (LoRA B zeroed), so the KL is above 0 from the
    first step of a stage that starts from an earlier stage's adapter; ``start`` (the default) gives 0 there."""
    from tests.algorithms.test_flow_grpo import _velocities
    from vgrpo.models import SD3Velocity
    from vgrpo.models.tiny import tiny_sd3_transformer

    config = make_config({"name": "vgrpo", "n_mc": 2, "ref_kl_coef": 1.0, "ref_kl_reference": "base"})
    policy = make_policy(config)  # LoRA B moved off zero: the adapter an earlier stage left
    base = _velocities(SD3Velocity(tiny_sd3_transformer()))
    adapted = _velocities(policy)
    assert (adapted - base).abs().max() > 1e-3
    zero = torch.zeros(N)
    algorithm, batch = prepared(config, policy, zero)
    assert algorithm.reference is not None
    with algorithm.reference.swapped_in():
        assert torch.equal(_velocities(policy), base)
    assert torch.equal(_velocities(policy), adapted)
    policy.zero_grad(set_to_none=True)
    kl_base = algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=0)["kl_ref"]
    assert kl_base > 1e-6 and any(g.abs().max() > 0 for g in grads(policy))

    start = make_config({"name": "vgrpo", "n_mc": 2, "ref_kl_coef": 1.0})
    assert start.algorithm.ref_kl_reference == "start"  # type: ignore[union-attr]
    algorithm, batch = prepared(start, policy, zero)
    policy.zero_grad(set_to_none=True)
    assert algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=0)["kl_ref"] == 0.0
