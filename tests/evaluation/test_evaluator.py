"""The evaluation routine: per-sample seeds, hybrid sampling and CFG as compositions of the plain sampler, the
table's per-tag GenEval and per-reward means, and a run on a tiny embedded pipeline with the world's rewards."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.rewards.test_geneval import GENEVAL_TAG_SET
from vgrpo.evaluation.evaluator import Sampling, evaluate, generate
from vgrpo.evaluation.grids import FRAME_COLORS, grid_image, grid_of, write_grid
from vgrpo.evaluation.tables import compare, flat_metrics, summarise
from vgrpo.flow import timestep_grid
from vgrpo.models.sd3 import SD3Velocity
from vgrpo.models.tiny import TINY_LATENT_SHAPE, tiny_sd3_transformer
from vgrpo.policy import Conditioning
from vgrpo.rewards.config import RewardConfig
from vgrpo.rewards.geneval import GenEvalReward
from vgrpo.rewards.multi import MultiReward, MultiRewardOutput
from vgrpo.samplers import ClassifierFreeGuidance, euler_ode_sample, hybrid_euler_sample
from vgrpo.seeding import sample_noise


def encode(prompts: list[str]) -> Conditioning:
    rows = []
    for p in prompts:
        g = torch.Generator().manual_seed(int(hashlib.sha256(p.encode()).hexdigest()[:8], 16))
        rows.append((torch.randn(6, 16, generator=g), torch.randn(16, generator=g)))
    return Conditioning(torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows]))


def decode(latents: torch.Tensor) -> np.ndarray:
    x = latents[:, :3].clamp(-1, 1).add(1).mul(127.5).round()
    return x.permute(0, 2, 3, 1).to(torch.uint8).numpy()


@pytest.fixture(scope="module")
def policy() -> SD3Velocity:
    return SD3Velocity(tiny_sd3_transformer(0)).eval()


@pytest.fixture(scope="module")
def base() -> SD3Velocity:
    return SD3Velocity(tiny_sd3_transformer(1)).eval()


def test_sample_noise_depends_only_on_seed_and_index() -> None:
    a = sample_noise(3, [0, 1, 2, 3], (2, 2))
    np.testing.assert_array_equal(sample_noise(3, [2], (2, 2))[0], a[2])
    assert not torch.equal(sample_noise(4, [2], (2, 2))[0], a[2]) and not torch.equal(a[0], a[1])


def test_generate_does_not_depend_on_micro_batch(policy: SD3Velocity) -> None:
    prompts = [f"prompt {i}" for i in range(5)]
    kw = {
        "encode": encode,
        "decode": decode,
        "policy": policy,
        "latent_shape": TINY_LATENT_SHAPE,
        "sampling": Sampling(num_steps=3, seed=0),
    }
    one, _ = generate(prompts=prompts, micro_batch=1, **kw)  # type: ignore[arg-type]
    all_, _ = generate(prompts=prompts, micro_batch=8, **kw)  # type: ignore[arg-type]
    np.testing.assert_array_equal(one, all_)
    sub, _ = generate(prompts=prompts[3:], **kw)  # type: ignore[arg-type]
    assert not np.array_equal(sub[0], all_[3])  # sample index 0 of another list: other noise, by design


def test_hybrid_sampling_switches_models_at_p_mix(policy: SD3Velocity, base: SD3Velocity) -> None:
    noise, cond, sigmas = sample_noise(0, range(3), TINY_LATENT_SHAPE), encode(["a", "b", "c"]), timestep_grid(10)
    only_policy = euler_ode_sample(policy, noise, cond, sigmas)
    torch.testing.assert_close(hybrid_euler_sample(policy, base, noise, cond, sigmas, 1.0), only_policy)
    torch.testing.assert_close(
        hybrid_euler_sample(policy, base, noise, cond, sigmas, 0.0), euler_ode_sample(base, noise, cond, sigmas)
    )
    mid = euler_ode_sample(base, euler_ode_sample(policy, noise, cond, sigmas[:9]), cond, sigmas[8:])
    torch.testing.assert_close(hybrid_euler_sample(policy, base, noise, cond, sigmas, 0.8), mid)  # 8 of 10 steps
    with pytest.raises(ValueError, match="p_mix"):
        hybrid_euler_sample(policy, base, noise, cond, sigmas, 1.5)


def test_cfg_is_the_guided_combination(policy: SD3Velocity) -> None:
    x, t, cond, uncond = torch.randn(3, *TINY_LATENT_SHAPE), torch.rand(3), encode(["a", "b", "c"]), encode([""])
    v_c, v_u = policy(x, t, cond), policy(x, t, uncond.index(torch.zeros(3, dtype=torch.long)))
    with torch.no_grad():
        guided = ClassifierFreeGuidance(policy, uncond, 4.5)(x, t, cond)
        torch.testing.assert_close(guided, v_u + 4.5 * (v_c - v_u), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(ClassifierFreeGuidance(policy, uncond, 1.0)(x, t, cond), v_c, atol=1e-5, rtol=1e-4)


def test_summarise_per_tag_and_per_reward_means() -> None:
    metadata = (
        [{"tag": "counting", "prompt": "p"}] * 2
        + [{"tag": "colors", "prompt": "q"}] * 2
        + [{"tag": "ocr", "prompt": 'say "hi"'}] * 2
    )
    rewards = MultiReward.from_configs(
        [RewardConfig(name="geneval"), RewardConfig(name="ocr", options={"engine": object()})]
    )
    nan = np.nan
    scored = MultiRewardOutput(
        scores={},
        raw={"geneval": np.array([1, 0.5, 0, 0, nan, nan]), "ocr": np.array([nan, nan, nan, nan, 1, 1])},
        sub_scores={
            "geneval/strict": np.array([1, 0, 0, 0, nan, nan]),
            "geneval/partial": np.array([1, 0.5, 0, 0, nan, nan]),
            "ocr/exact": np.array([nan, nan, nan, nan, 1, 1]),
        },
    )
    table = summarise(scored, [m["prompt"] for m in metadata], metadata, rewards, group_size=2)
    g = table["rewards"]["geneval"]
    assert g["per_tag"] == {
        "counting": {"strict": 0.5, "strict_ci": [0.5, 0.5], "partial": 0.75, "images": 2},
        "colors": {"strict": 0.0, "strict_ci": [0.0, 0.0], "partial": 0.0, "images": 2},
    }
    assert g["geneval_strict_ci"] == [0.25, 0.25]  # one prompt per tag: nothing to resample within a tag
    detail = table["per_prompt"]
    assert detail["prompt"] == ["p", "q", 'say "hi"'] and detail["tag"] == ["counting", "colors", "ocr"]
    assert detail["geneval"]["strict"] == [0.5, 0.0, None] and detail["ocr"]["mean"] == [None, None, 1.0]
    assert detail["credited"] == [[True, False], [False, False], [True, True]]
    assert g["geneval_strict"] == 0.25 and g["images"] == 4 and g["varied_group_frac"] == 0.5  # mean of per-tag
    o = table["rewards"]["ocr"]
    assert o["mean"] == 1.0 and o["exact"] == 1.0 and o["images"] == 2 and o["varied_group_frac"] == 0.0
    flat = flat_metrics(table)
    assert flat["eval/geneval_geneval_strict"] == 0.25 and flat["eval/ocr"] == 1.0
    assert flat["eval/geneval_counting_strict"] == 0.5
    assert flat["eval/ocr_ci_low"] == flat["eval/ocr_ci_high"] == 1.0
    assert flat["eval/geneval_geneval_strict_ci_low"] == 0.25
    with pytest.raises(ValueError, match="whole groups"):
        summarise(scored, ["p"] * 5, metadata[:5], rewards, group_size=2)


def test_evaluate_a_tiny_pipeline_with_world_rewards(tmp_path: Path) -> None:
    from tests.models.test_embedded import TINY
    from vgrpo.models.embedded import build_pipeline, train_clip_tokenizer
    from vgrpo.models.sd3 import SD3Adapter
    from vgrpo.world import GENEVAL_TAGS, make_splits

    _, test = make_splits(0, 1, 7, tags=(*GENEVAL_TAGS, "ocr"))
    metadata = [md for md, _ in test]
    pipe = build_pipeline(TINY, train_clip_tokenizer([m["prompt"] for m in metadata] + [""], TINY), seed=0)
    adapter, velocity = SD3Adapter(pipe), SD3Velocity(pipe.transformer.eval())
    with MultiReward.from_configs([RewardConfig(name="geneval"), RewardConfig(name="ocr")]) as rewards:
        kw = {
            "adapter": adapter,
            "policy": velocity,
            "metadata": metadata,
            "rewards": rewards,
            "group_size": 2,
            "micro_batch": 4,
        }
        plain = Sampling(num_steps=2, seed=0)
        table, images = evaluate(overlap=True, sampling=plain, **kw)  # type: ignore[arg-type]
        again, images2 = evaluate(overlap=False, sampling=plain, **kw)  # type: ignore[arg-type]
        hybrid = Sampling(num_steps=2, seed=0, guidance_scale=3.0, p_mix=0.5)
        cfg, _ = evaluate(sampling=hybrid, base=velocity, **kw)  # type: ignore[arg-type]
    np.testing.assert_array_equal(images, images2)
    assert images.shape == (14, 16, 16, 3)
    assert table["rewards"] == again["rewards"]
    assert table["rewards"]["geneval"]["images"] == 12 and table["rewards"]["ocr"]["images"] == 2
    assert set(table["rewards"]["geneval"]["per_tag"]) == GENEVAL_TAG_SET
    assert cfg["sampling"]["guidance_scale"] == 3.0 and cfg["sampling"]["p_mix"] == 0.5
    json.dumps(table)  # the table is JSON as it is
    write_grid(tmp_path / "grid.png", images, cols=2)
    from PIL import Image

    assert Image.open(tmp_path / "grid.png").size == (2 * 18 * 4, 7 * 18 * 4)


def _world_table(images: np.ndarray, metadata: list[dict], group_size: int) -> dict:
    rewards = MultiReward.from_configs([RewardConfig(name="geneval")])
    prompts = [md["prompt"] for md in metadata]
    return summarise(rewards(images, prompts, metadata), prompts, metadata, rewards, group_size=group_size)


def test_world_ground_truth_renders_score_one_on_every_tag_and_noise_near_zero() -> None:
    from vgrpo.world import GENEVAL_TAGS, make_splits, render

    _, test = make_splits(5, 1, 42, tags=GENEVAL_TAGS)
    metadata = [md for md, _ in test for _ in range(2)]
    table = _world_table(np.stack([render(scene) for _, scene in test for _ in range(2)]), metadata, 2)
    g = table["rewards"]["geneval"]
    assert set(g["per_tag"]) == set(GENEVAL_TAGS) and g["geneval_strict"] == 1.0 and g["geneval_partial"] == 1.0
    assert g["varied_group_frac"] == 0.0  # identical samples in each group give GRPO no signal
    noise = np.random.default_rng(0).integers(0, 256, (84, 32, 32, 3), dtype=np.uint8)
    assert _world_table(noise, metadata, 2)["rewards"]["geneval"]["geneval_strict"] <= 0.05


GENEVAL = {"geneval": GenEvalReward}  # what compare asks of each key's reward


def _two_evaluations(gain: float) -> tuple[dict, dict]:
    """Base and trained tables of the same 60 prompts (3 tags), the trained strict scores shifted by ``gain``."""
    rng = np.random.default_rng(0)
    tags = ["single_object", "two_object", "counting"] * 20
    metadata = [{"tag": t, "prompt": f"p{i}"} for i, t in enumerate(tags) for _ in range(4)]
    rewards = MultiReward.from_configs([RewardConfig(name="geneval")])
    tables = []
    for shift in (0.0, gain):
        strict = (rng.random(240) < 0.3 + shift).astype(float)
        scored = MultiRewardOutput(
            scores={}, raw={"geneval": strict}, sub_scores={"geneval/strict": strict, "geneval/partial": strict}
        )
        tables.append(summarise(scored, [m["prompt"] for m in metadata], metadata, rewards, group_size=4))
    return tables[0], tables[1]


def test_compare_adds_paired_gains_with_intervals() -> None:
    base, trained = _two_evaluations(0.4)
    compare(trained, base, GENEVAL)
    g = trained["rewards"]["geneval"]
    assert g["geneval_strict_gain"] == pytest.approx(g["geneval_strict"] - base["rewards"]["geneval"]["geneval_strict"])
    low, high = g["geneval_strict_gain_ci"]
    assert 0.2 < low < g["geneval_strict_gain"] < high  # a gain of 0.4 on 60 prompts x 4 is resolved
    assert g["gain"] == pytest.approx(g["mean"] - base["rewards"]["geneval"]["mean"])
    assert set(g["per_tag"]["counting"]) >= {"strict_gain", "strict_gain_ci"}
    same, again = _two_evaluations(0.0)
    compare(again, same, GENEVAL)
    low, high = again["rewards"]["geneval"]["geneval_strict_gain_ci"]
    assert low < 0 < high  # no gain: the interval straddles 0


def test_compare_refuses_other_prompts_or_settings() -> None:
    base, trained = _two_evaluations(0.1)
    other = {**base, "per_prompt": {**base["per_prompt"], "prompt": ["x", *base["per_prompt"]["prompt"][1:]]}}
    with pytest.raises(ValueError, match="other prompts"):
        compare(trained, other, GENEVAL)
    with pytest.raises(ValueError, match="group_size"):
        compare(trained, {**base, "group_size": 2}, GENEVAL)
    with pytest.raises(ValueError, match="no per-prompt scores"):
        compare(trained, {k: v for k, v in base.items() if k != "per_prompt"}, GENEVAL)


def test_grid_captions_rows_and_frames_credited_images() -> None:
    images = np.full((4, 8, 8, 3), 128, np.uint8)
    plain = grid_image(images, cols=2, scale=2)
    assert plain.shape == (2 * 10 * 2, 2 * 10 * 2, 3) and (plain[0, 0] == FRAME_COLORS[None]).all()
    table = {
        "group_size": 2,
        "per_prompt": {
            "prompt": ["a photo of a circle", 'a sign that says "hi"'],
            "credited": [[True, False], [None, True]],
        },
    }
    marked = grid_image(**grid_of(table, images, prompts=2), scale=2)
    assert marked.shape == (2 * (10 * 2 + 14), 2 * 10 * 2, 3)
    assert (marked[0, 0] == FRAME_COLORS[True]).all() and (marked[0, 20] == FRAME_COLORS[False]).all()
    assert (marked[34, 0] == FRAME_COLORS[None]).all() and (marked[34, 20] == FRAME_COLORS[True]).all()
    caption = marked[20:34]
    assert (caption.max(-1) > 200).any()  # the prompt is written in light pixels under its row
    with pytest.raises(ValueError, match="captions"):
        grid_image(images, cols=2, captions=["one"])
