import math

import pytest
import torch

from tests.algorithms.helpers import GROUP, PROMPTS, make_config, make_policy
from vgrpo.algorithms import ALGORITHMS, build_algorithm
from vgrpo.models.tiny import TINY_LATENT_SHAPE, tiny_conditioning
from vgrpo.training.guards import NonFiniteError
from vgrpo.training.iteration import minibatch_schedule, train_iteration
from vgrpo.training.optim import build_optimizer

PROMPT_TEXTS = ["a red circle", "two blue squares"]


def toy_reward(samples, prompts):
    return {"bright": samples.mean(dim=(1, 2, 3)), "contrast": samples.std(dim=(1, 2, 3))}


def _algorithm_overrides(name):
    extra = {"window_size": 2, "shift_interval": 1} if name == "mixgrpo" else {}
    return {"name": name, **extra}


def _run(name, *, lora=True, iterations=2, seed=0, gradient_steps=2):
    config = make_config(
        _algorithm_overrides(name),
        optim={"gradient_steps": gradient_steps, "lr": 1e-2},
        **({} if lora else {"lora": None}),
    )
    policy = make_policy(config, perturb_lora=False)
    before = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    algorithm = build_algorithm(config, policy=policy, latent_shape=TINY_LATENT_SHAPE)
    optimizer = build_optimizer(policy, config.optim)
    generator = torch.Generator().manual_seed(seed)
    records = [
        train_iteration(
            policy=policy,
            algorithm=algorithm,
            optimizer=optimizer,
            reward_fn=toy_reward,
            prompts=PROMPT_TEXTS,
            cond=tiny_conditioning(PROMPTS),
            config=config,
            latent_shape=TINY_LATENT_SHAPE,
            generator=generator,
            iteration=it,
        )
        for it in range(iterations)
    ]
    return policy, before, records, algorithm


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_training_step_with_lora_changes_only_the_adapter(name):
    policy, before, records, _ = _run(name)
    after = policy.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed, "no parameter moved"
    assert all("lora" in k for k in changed), sorted(k for k in changed if "lora" not in k)[:5]
    assert any("lora_B" in k for k in changed)
    for record in records:
        assert record.samples.shape == (PROMPTS * GROUP, *TINY_LATENT_SHAPE)
        assert all(math.isfinite(v) for v in record.metrics.values())
        for key in (
            "reward/total_mean",
            "advantage/zero_variance_frac",
            "train/grad_norm",
            "time/rollout_s",
            "time/reward_s",
            "time/update_s",
            "nfe/rollout_per_sample",
        ):
            assert key in record.metrics, key


@pytest.mark.parametrize("name", ["vgrpo", "flow_grpo", "diffusion_nft"])
def test_full_fine_tuning_updates_the_transformer_weights(name):
    policy, before, _, _ = _run(name, lora=False, iterations=1)
    after = policy.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert not any("lora" in k for k in after)
    assert len(changed) > 0.5 * len(before)


def test_vgrpo_record_reports_the_papers_diagnostics():
    _, _, records, _ = _run("vgrpo")
    m = records[0].metrics
    for key in (
        "surrogate/cv",
        "surrogate/cv_within_group",
        "train/ratio_mean",
        "train/ratio_min",
        "train/ratio_max",
        "train/clip_frac",
        "train/kl",
        "train/approx_kl",
        "reward/bright_mean",
        "reward/contrast_std",
        "advantage/std",
    ):
        assert key in m, key
    assert m["train/ratio_mean_first"] == 1.0 and m["train/ratio_min_first"] == 1.0
    assert m["train/ratio_max_last"] != 1.0  # the second gradient step sees the first one's update


def test_same_seed_gives_identical_iterations():
    _, _, a, _ = _run("vgrpo", seed=3)
    _, _, b, _ = _run("vgrpo", seed=3)
    _, _, c, _ = _run("vgrpo", seed=4)
    for ra, rb in zip(a, b, strict=True):
        assert torch.equal(ra.samples, rb.samples)
        assert {k: v for k, v in ra.metrics.items() if not k.startswith("time/")} == {
            k: v for k, v in rb.metrics.items() if not k.startswith("time/")
        }
    assert not torch.equal(a[0].samples, c[0].samples)


def test_flow_grpo_kl_to_reference_grows_after_an_update_and_reference_is_restored():
    policy, _, records, algorithm = _run("flow_grpo", iterations=2)
    assert records[0].metrics["train/ratio_mean_first"] == pytest.approx(1.0, abs=1e-5)
    assert records[1].metrics["train/kl"] > 0
    live = [p.detach().clone() for p in policy.parameters() if p.requires_grad]
    with algorithm.reference.swapped_in():
        swapped = [p.detach().clone() for p in policy.parameters() if p.requires_grad]
    restored = [p.detach() for p in policy.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(live, swapped, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(live, restored, strict=True))


def test_mixgrpo_trains_only_inside_its_window():
    config = make_config(_algorithm_overrides("mixgrpo"))
    policy = make_policy(config)
    algorithm = build_algorithm(config, policy=policy, latent_shape=TINY_LATENT_SHAPE)
    cond = tiny_conditioning(PROMPTS).repeat_interleave(GROUP)
    g = torch.Generator().manual_seed(0)
    for iteration, start in ((0, 0), (1, 1), (4, 4), (5, 0)):
        noise = torch.randn(PROMPTS * GROUP, *TINY_LATENT_SHAPE, generator=g)
        rollout = algorithm.rollout(policy, cond, noise, g, iteration)
        batch = algorithm.prepare(policy, rollout, cond, torch.zeros(PROMPTS * GROUP), g)
        steps = batch.payload.train_steps
        assert set(steps.flatten().tolist()) == {start, start + 1}
        assert torch.nonzero(rollout.trajectory.sde_steps).flatten().tolist() == [start, start + 1]


@pytest.mark.parametrize(("name", "field"), [("diffusion_nft", "v_old"), ("vgrpo", "old_surrogates")])
def test_a_non_finite_prepared_tensor_stops_the_update_and_is_named(monkeypatch, name, field):
    config = make_config(_algorithm_overrides(name))
    policy = make_policy(config)
    algorithm = build_algorithm(config, policy=policy, latent_shape=TINY_LATENT_SHAPE)
    precompute = algorithm.precompute

    def poisoned(*args):
        payload, metrics = precompute(*args)
        getattr(payload, field).view(-1)[0] = float("nan")
        return payload, metrics

    monkeypatch.setattr(algorithm, "precompute", poisoned)
    before = [p.detach().clone() for p in policy.parameters() if p.requires_grad]
    with pytest.raises(NonFiniteError) as err:
        train_iteration(
            policy=policy,
            algorithm=algorithm,
            optimizer=build_optimizer(policy, config.optim),
            reward_fn=toy_reward,
            prompts=PROMPT_TEXTS,
            cond=tiny_conditioning(PROMPTS),
            config=config,
            latent_shape=TINY_LATENT_SHAPE,
            generator=torch.Generator().manual_seed(0),
            iteration=1,
        )
    assert err.value.quantity == field
    after = [p.detach() for p in policy.parameters() if p.requires_grad]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_diffusion_nft_old_policy_follows_by_ema():
    def gap(policy, algorithm):
        live = [p.detach() for p in policy.parameters() if p.requires_grad]
        return max((v - p).abs().max().item() for v, p in zip(algorithm.old.values, live, strict=True))

    policy, _, _, algorithm = _run("diffusion_nft", iterations=1)
    assert gap(policy, algorithm) == 0.0  # decay min(0.001 * 0, 0.5) = 0: old := current
    policy, _, records, algorithm = _run("diffusion_nft", iterations=2)
    assert gap(policy, algorithm) > 0  # decay 0.001 at iteration 1: old lags slightly
    assert records[1].metrics["nft/ema_decay"] == pytest.approx(0.001)


def test_minibatch_schedule_covers_the_batch_once_per_pass():
    g = torch.Generator().manual_seed(0)
    schedule = minibatch_schedule(12, 3, 6, g)
    assert len(schedule) == 6
    for start in (0, 3):
        assert sorted(torch.cat(schedule[start : start + 3]).tolist()) == list(range(12))
    assert all(torch.equal(s, torch.arange(12)) for s in minibatch_schedule(12, 1, 2, g))


def test_reward_with_wrong_shape_is_reported_by_name():
    config = make_config({"name": "vgrpo"})
    policy = make_policy(config)
    with pytest.raises(ValueError, match="reward 'bad' returned shape"):
        train_iteration(
            policy=policy,
            algorithm=build_algorithm(config, policy=policy, latent_shape=TINY_LATENT_SHAPE),
            optimizer=build_optimizer(policy, config.optim),
            reward_fn=lambda s, p: {"bad": torch.zeros(3)},
            prompts=PROMPT_TEXTS,
            cond=tiny_conditioning(PROMPTS),
            config=config,
            latent_shape=TINY_LATENT_SHAPE,
            generator=torch.Generator(),
            iteration=0,
        )


def test_flow_grpo_first_order_trains_every_step_but_the_last_for_every_sample():
    """``timestep_order: first`` at fraction 0.99 of T = 6 SDE steps: steps 0..4, in order, for each sample (the
    later Flow-GRPO release's train_timesteps); ``shuffled`` draws a subset per sample."""
    steps = {}
    for order in ("first", "shuffled"):
        config = make_config({"name": "flow_grpo", "timestep_order": order, "kl_coef": 0.0})
        policy = make_policy(config)
        algorithm = build_algorithm(config, policy=policy, latent_shape=TINY_LATENT_SHAPE)
        cond = tiny_conditioning(PROMPTS).repeat_interleave(GROUP)
        g = torch.Generator().manual_seed(0)
        noise = torch.randn(PROMPTS * GROUP, *TINY_LATENT_SHAPE, generator=g)
        rollout = algorithm.rollout(policy, cond, noise, g, 0)
        steps[order] = algorithm.prepare(policy, rollout, cond, torch.zeros(PROMPTS * GROUP), g).payload.train_steps
    assert steps["first"].tolist() == [[0, 1, 2, 3, 4]] * (PROMPTS * GROUP)
    assert steps["shuffled"].shape == (PROMPTS * GROUP, 5)
    assert len({tuple(row) for row in steps["shuffled"].tolist()}) > 1
    assert "timestep_order" not in make_config({"name": "flow_grpo"}).algorithm.model_dump()


def test_shared_group_noise_starts_a_group_from_one_noise_and_the_sde_separates_it():
    from vgrpo.training.iteration import rollout_batch

    config = make_config(_algorithm_overrides("mixgrpo"), rollout={"group_noise": "shared"})
    policy = make_policy(config)
    algorithm = build_algorithm(config, policy=policy, latent_shape=TINY_LATENT_SHAPE)
    batches = {}
    for noise in ("shared", "independent"):
        batches[noise] = rollout_batch(
            policy=policy,
            algorithm=algorithm,
            prompts=PROMPT_TEXTS,
            cond=tiny_conditioning(PROMPTS),
            minibatches=1,
            latent_shape=TINY_LATENT_SHAPE,
            generator=torch.Generator().manual_seed(0),
            iteration=0,
            group_noise=noise,
        )
    shared = batches["shared"].rollout.trajectory.latents[:, 0].reshape(PROMPTS, GROUP, -1)
    independent = batches["independent"].rollout.trajectory.latents[:, 0].reshape(PROMPTS, GROUP, -1)
    assert torch.equal(shared[:, :1].expand_as(shared), shared)  # one initial noise per prompt
    assert not torch.equal(shared[0], shared[1]) and not torch.equal(
        independent[:, :1].expand_as(independent), independent
    )
    finals = batches["shared"].rollout.samples.reshape(PROMPTS, GROUP, -1)
    assert not torch.equal(finals[:, 0], finals[:, 1])  # the window's SDE noise makes the group differ
    assert config.model_dump()["rollout"]["group_noise"] == "shared"
    assert "group_noise" not in make_config({"name": "mixgrpo"}).model_dump()["rollout"]


@pytest.mark.parametrize("name", ["vgrpo", "naive_elbo", "diffusion_nft"])
def test_an_ode_rollout_refuses_shared_group_noise(name):
    with pytest.raises(ValueError, match=rf"rollout.group_noise=shared: algorithm.name={name} samples by ODE"):
        make_config({"name": name}, rollout={"group_noise": "shared"})


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_method_logs_the_plateau_diagnostics(name):
    policy, before, records, _ = _run(name, iterations=1)
    m = records[0].metrics
    for key in ("advantage/abs_mean", "advantage/zero_variance_frac", "train/grad_norm", "update/norm_rel"):
        assert key in m, key
    # update/norm is the distance the optimizer steps moved the trainable weights, measured here from the outside
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    after = policy.state_dict()
    moved = sum(float((after[k].float() - before[k].float()).pow(2).sum()) for k in trainable if k in after)
    assert len([k for k in trainable if k in after]) == len(trainable)
    assert m["update/norm"] == pytest.approx(moved**0.5, rel=1e-4) and m["update/norm"] > 0
    if name == "diffusion_nft":  # no ratio: its reward weight's saturation stands in for the clip's
        assert "train/ratio_std" not in m and 0.0 <= m["nft/reward_weight_saturated_frac"] <= 1.0
    else:  # the first step's ratio is the rollout's (1, up to recomputation), the last sees the first step's update
        assert m["train/ratio_std_first"] == pytest.approx(0.0, abs=1e-4)
        assert m["train/ratio_std_last"] > m["train/ratio_std_first"]
