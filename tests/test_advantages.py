import pytest
import torch

from vgrpo.advantages import (
    clamp_advantages,
    compute_advantages,
    group_normalize,
    soft_clip_advantages,
    zero_variance_groups,
)


def test_group_normalize_matches_hand_computation():
    r = torch.tensor([1.0, 2.0, 3.0, 10.0, 10.0, 40.0])
    adv = group_normalize(r, 3, delta=0.0)
    g1 = (torch.tensor([1.0, 2.0, 3.0]) - 2.0) / torch.tensor([1.0, 2.0, 3.0]).std(unbiased=False)
    g2 = (torch.tensor([10.0, 10.0, 40.0]) - 20.0) / torch.tensor([10.0, 10.0, 40.0]).std(unbiased=False)
    torch.testing.assert_close(adv, torch.cat([g1, g2]))
    torch.testing.assert_close(adv.reshape(2, 3).mean(dim=1), torch.zeros(2), atol=1e-6, rtol=0)


def test_group_normalize_constant_group_gives_exact_zeros_not_nan():
    r = torch.tensor([0.1, 0.1, 0.1, 0.3, 0.3, 0.3, 0.0, 1.0, 0.5])
    adv = group_normalize(r, 3, delta=0.0)
    assert torch.isfinite(adv).all()
    assert torch.equal(adv[:6], torch.zeros(6))
    assert zero_variance_groups(r, 3).tolist() == [True, True, False]


def test_global_std_uses_one_std_for_the_batch():
    r = torch.tensor([1.0, 3.0, 10.0, 30.0])
    adv = group_normalize(r, 2, std_scope="global", delta=0.0)
    std = r.std(unbiased=False)
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0, -10.0, 10.0]) / std)


def test_group_normalize_rejects_bad_layouts():
    with pytest.raises(ValueError, match="groups of 4"):
        group_normalize(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="G >= 2"):
        group_normalize(torch.zeros(6), 1)


def test_soft_clip_is_bounded_by_eta_and_identity_near_zero():
    a = torch.linspace(-100, 100, 1001)
    clipped = soft_clip_advantages(a, 3.0)
    assert clipped.abs().max() <= 3.0  # float32 tanh saturates to exactly 1 far out
    assert soft_clip_advantages(torch.tensor([6.0]), 3.0).item() == pytest.approx(3.0 * 0.9640276, rel=1e-6)
    small = torch.tensor([-1e-3, 0.0, 1e-3])
    torch.testing.assert_close(soft_clip_advantages(small, 3.0), small, rtol=1e-6, atol=0)
    assert torch.all(clipped[1:] >= clipped[:-1])  # monotone: the order of samples is kept


def test_clamp_advantages():
    assert clamp_advantages(torch.tensor([-9.0, 0.5, 7.0]), 5.0).tolist() == [-5.0, 0.5, 5.0]


def test_multi_reward_normalize_then_sum_vs_sum_then_normalize():
    a = torch.tensor([0.0, 1.0, 2.0, 3.0])
    b = torch.tensor([10.0, 0.0, 5.0, 5.0])
    w = {"a": 1.0, "b": 0.5}
    nts = compute_advantages({"a": a, "b": b}, group_size=2, weights=w, soft_clip_eta=None, delta=0.0)
    expected = group_normalize(a, 2, delta=0.0) + 0.5 * group_normalize(b, 2, delta=0.0)
    torch.testing.assert_close(nts.advantages, expected)
    stn = compute_advantages(
        {"a": a, "b": b},
        group_size=2,
        weights=w,
        aggregation="sum_then_normalize",
        soft_clip_eta=None,
        delta=0.0,
    )
    torch.testing.assert_close(stn.advantages, group_normalize(a + 0.5 * b, 2, delta=0.0))
    torch.testing.assert_close(stn.total_reward, a + 0.5 * b)
    # second group of b is constant: only a contributes there under normalize_then_sum
    assert nts.metrics["reward/b_std"] == pytest.approx(b.std(unbiased=False).item())


def test_compute_advantages_reports_zero_variance_fraction_and_clips():
    r = torch.tensor([1.0, 1.0, 0.0, 100.0])
    res = compute_advantages({"r": r}, group_size=2, soft_clip_eta=0.5)
    assert res.metrics["advantage/zero_variance_frac"] == 0.5
    assert res.advantages.abs().max() < 0.5
    assert res.metrics["advantage/abs_max_before_clip"] > 0.99


def test_compute_advantages_rejects_mismatched_weights_and_nan():
    with pytest.raises(ValueError, match="unknown \\['c'\\]"):
        compute_advantages({"a": torch.zeros(4)}, group_size=2, weights={"a": 1.0, "c": 1.0})
    with pytest.raises(ValueError, match="reward 'a' has non-finite"):
        compute_advantages({"a": torch.tensor([0.0, float("nan"), 1.0, 2.0])}, group_size=2)


def test_std_ddof_zero_is_numpys_std_and_one_is_torchs_unbiased_std() -> None:
    import numpy as np

    # Group [1, 2, 3, 4]: deviations -1.5, -0.5, 0.5, 1.5, their squares sum to 5: the population std is
    # sqrt(5 / 4) = 1.1180, the unbiased std sqrt(5 / 3) = 1.2910.
    r = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 8.0])
    deviations = torch.tensor([-1.5, -0.5, 0.5, 1.5])
    population = group_normalize(r, 4, delta=0.0)
    unbiased = group_normalize(r, 4, delta=0.0, ddof=1)
    torch.testing.assert_close(population[:4], deviations / 1.1180340)
    torch.testing.assert_close(unbiased[:4], deviations / 1.2909944)
    assert population[3].item() == pytest.approx(1.3416408) and unbiased[3].item() == pytest.approx(1.1618950)
    assert torch.equal(population, group_normalize(r, 4, delta=0.0, ddof=0))  # the default is ddof 0
    grouped = r.reshape(2, 4).double().numpy()
    for ddof, adv in ((0, population), (1, unbiased)):  # Flow-GRPO's np.std is ddof 0; torch.std() is ddof 1
        expected = (grouped - grouped.mean(1, keepdims=True)) / grouped.std(1, ddof=ddof, keepdims=True)
        torch.testing.assert_close(adv, torch.from_numpy(expected).float().reshape(-1))
    torch.testing.assert_close(unbiased, population * (3 / 4) ** 0.5)  # G = 4: sqrt((G - 1) / G)
    global_unbiased = group_normalize(r, 4, std_scope="global", delta=0.0, ddof=1)
    torch.testing.assert_close(global_unbiased[:4], deviations / float(np.std(r.numpy(), ddof=1)))


@pytest.mark.parametrize("aggregation", ["normalize_then_sum", "sum_then_normalize"])
def test_compute_advantages_passes_std_ddof_to_every_normalisation(aggregation: str) -> None:
    rewards = {"a": torch.tensor([0.0, 1.0, 2.0, 4.0, 1.0, 1.0]), "b": torch.tensor([3.0, 1.0, 2.0, 0.0, 5.0, 1.0])}
    kwargs = {"group_size": 3, "aggregation": aggregation, "delta": 0.0}
    population = compute_advantages(rewards, **kwargs).advantages
    unbiased = compute_advantages(rewards, std_ddof=1, **kwargs).advantages
    assert torch.equal(compute_advantages(rewards, std_ddof=0, **kwargs).advantages, population)
    torch.testing.assert_close(unbiased, population * (2 / 3) ** 0.5)  # G = 3: sqrt((G - 1) / G)


def test_a_reward_adds_nothing_to_the_groups_it_does_not_score() -> None:
    nan = float("nan")
    ocr = torch.tensor([0.2, 0.8, 0.4, nan, nan, nan])  # scores prompt 0 only
    geneval = torch.tensor([nan, nan, nan, 1.0, 0.0, 0.0])  # scores prompt 1 only
    res = compute_advantages({"ocr": ocr, "geneval": geneval}, group_size=3, weights={"ocr": 1.0, "geneval": 0.5})
    expected = torch.cat(
        [group_normalize(ocr[:3], 3), 0.5 * group_normalize(torch.tensor([1.0, 0.0, 0.0]), 3)]
    )  # each reward normalised within the groups it scores, then weighted
    torch.testing.assert_close(res.advantages, expected)
    torch.testing.assert_close(res.total_reward, torch.tensor([0.2, 0.8, 0.4, 0.5, 0.0, 0.0]))
    assert res.metrics["reward/ocr_mean"] == pytest.approx(0.4667, abs=1e-4)
    assert res.metrics["reward/geneval_scored_frac"] == 0.5
    summed = compute_advantages({"ocr": ocr, "geneval": geneval}, group_size=3, aggregation="sum_then_normalize")
    torch.testing.assert_close(summed.advantages, group_normalize(summed.total_reward, 3))


def test_the_global_std_of_a_partly_scoring_reward_is_over_the_groups_it_scores() -> None:
    nan = float("nan")
    r = torch.tensor([0.0, 2.0, nan, nan, 1.0, 5.0])
    other = torch.tensor([nan, nan, 3.0, 4.0, nan, nan])  # scores the group r does not, at weight 0
    res = compute_advantages(
        {"r": r, "other": other}, group_size=2, weights={"r": 1.0, "other": 0.0}, std_scope="global", delta=0.0
    )
    scored = torch.tensor([0.0, 2.0, 1.0, 5.0])
    std = scored.std(correction=0)
    torch.testing.assert_close(res.advantages, torch.tensor([-1.0, 1.0, 0.0, 0.0, -2.0, 2.0]) / std)


def test_a_group_no_reward_scores_and_a_partly_scored_group_are_errors() -> None:
    nan = float("nan")
    with pytest.raises(ValueError, match="prompt 1 of the batch is scored by no reward"):
        compute_advantages({"a": torch.tensor([1.0, 0.0, nan, nan])}, group_size=2)
    with pytest.raises(ValueError, match="NaN for part of a prompt's group"):
        compute_advantages({"a": torch.tensor([1.0, nan, 0.0, 1.0])}, group_size=2)
    with pytest.raises(ValueError, match="reward 'a' has non-finite"):
        compute_advantages({"a": torch.tensor([1.0, float("inf"), 0.0, 1.0])}, group_size=2)


def test_compute_advantages_reports_the_size_the_clips_take() -> None:
    # Groups of 4: [0, 0, 0, 1] -> A = -1/sqrt(3) x3, sqrt(3); [0, 1, 0, 1] -> A = -1, 1, -1, 1; [2, 2, 2, 2] -> 0.
    r = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    res = compute_advantages({"r": r}, group_size=4, delta=0.0, soft_clip_eta=1.5, clamp=0.9)
    m = res.metrics
    assert m["advantage/abs_mean_before_clip"] == pytest.approx((2 * 3**0.5 + 4) / 12)  # 0.6220
    # only sqrt(3) = 1.732 reaches eta = 1.5
    assert m["advantage/soft_clip_saturated_frac"] == pytest.approx(1 / 12)
    # the clamp sees the soft-clipped values: 1.5 tanh(sqrt(3) / 1.5) = 1.228 > 0.9, 1.5 tanh(1 / 1.5) = 0.874 < 0.9
    assert m["advantage/clamped_frac"] == pytest.approx(1 / 12)
    # after both: 1.5 tanh(1 / (1.5 sqrt(3))) = 0.550433 x3, the clamp 0.9, 0.874174 x4
    assert m["advantage/abs_mean"] == pytest.approx((3 * 0.550433 + 0.9 + 4 * 0.874174) / 12, rel=1e-5)  # 0.5040
    assert m["advantage/zero_variance_frac"] == pytest.approx(1 / 3)


def test_compute_advantages_without_clips_has_no_clip_shares() -> None:
    r = torch.tensor([0.0, 1.0, 0.0, 3.0])
    m = compute_advantages({"r": r}, group_size=2, delta=0.0).metrics
    assert m["advantage/abs_mean"] == m["advantage/abs_mean_before_clip"] == pytest.approx(1.0)
    assert "advantage/soft_clip_saturated_frac" not in m and "advantage/clamped_frac" not in m
