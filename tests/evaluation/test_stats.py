"""Bootstrap intervals over prompts: coverage of the mean, stratified means, paired gains, and errors."""

from __future__ import annotations

import numpy as np
import pytest

from vgrpo.evaluation.stats import bootstrap_ci, stratified_mean


def test_bootstrap_ci_brackets_the_mean_and_matches_the_normal_interval() -> None:
    x = np.random.default_rng(0).normal(0.4, 0.2, size=400)
    low, high = bootstrap_ci(x)
    assert low < x.mean() < high
    half = 1.96 * x.std(ddof=1) / np.sqrt(x.size)  # the normal interval of a mean, to which the bootstrap tends
    assert (high - low) / 2 == pytest.approx(half, rel=0.1)


def test_bootstrap_ci_is_seeded_and_narrows_with_more_prompts() -> None:
    x = np.random.default_rng(1).random(800)
    assert bootstrap_ci(x, seed=3) == bootstrap_ci(x, seed=3)
    wide, narrow = bootstrap_ci(x[:50]), bootstrap_ci(x)
    assert narrow[1] - narrow[0] < 0.5 * (wide[1] - wide[0])


def test_stratified_statistic_is_the_mean_of_stratum_means() -> None:
    values = np.array([1.0, 1.0, 1.0, 0.0])  # tag a: 3 prompts all right, tag b: 1 prompt wrong
    strata = ["a", "a", "a", "b"]
    assert stratified_mean(values, strata) == 0.5
    assert stratified_mean(values) == 0.75
    # Each stratum is resampled within itself: no spread inside a stratum, no spread in the statistic.
    assert bootstrap_ci(values, strata) == (0.5, 0.5)


def test_paired_differences_remove_shared_prompt_difficulty() -> None:
    rng = np.random.default_rng(2)
    difficulty = rng.random(300)
    before, after = difficulty, difficulty + 0.05 + rng.normal(0, 0.01, 300)
    paired = bootstrap_ci(after - before)
    assert paired[0] > 0.04 and paired[1] < 0.06
    unpaired_half = 1.96 * np.hypot(before.std(), after.std()) / np.sqrt(300)
    assert (paired[1] - paired[0]) / 2 < 0.1 * unpaired_half


@pytest.mark.parametrize(
    ("values", "kwargs", "match"),
    [([], {}, "non-empty"), ([1.0, 2.0], {"strata": ["a"]}, "strata has 1 labels"), ([1.0], {"level": 1.0}, "level")],
)
def test_bootstrap_ci_rejects_bad_input(values: list[float], kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bootstrap_ci(values, **kwargs)
