"""Learned reward models of the embedded world: data, losses, training, saved-directory contract, accuracy."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from vgrpo.world.clip import (
    TrainedRewardModel,
    build_processor,
    clip_contrastive_loss,
    pixel_values,
    save_reward_model,
    train_world_clip,
)
from vgrpo.world.config import WorldAugmentConfig, WorldCLIPConfig, WorldPreferenceConfig
from vgrpo.world.degrade import DEGRADATIONS, augment, gaussian_blur, hard_negative
from vgrpo.world.preference import (
    bradley_terry_loss,
    evaluation_pairs,
    preference_pairs,
    train_world_preference,
)
from vgrpo.world.prompts import allowed_pairs, sample_metadata, scene_for
from vgrpo.world.reward_eval import evaluate_clip, evaluate_preference

TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr", "ocr", "preference")
TINY_ARCH = {
    "vision_hidden_size": 32,
    "vision_layers": 1,
    "vision_heads": 2,
    "text_hidden_size": 32,
    "text_layers": 1,
    "text_heads": 2,
    "projection_dim": 32,
    "max_text_tokens": 20,
}


def tiny_clip_config(**kw: object) -> WorldCLIPConfig:
    return WorldCLIPConfig(**{**TINY_ARCH, "steps": 4, "batch_size": 16, "warmup_steps": 1, **kw})


def mixed_records(n: int, seed: int) -> list:
    """``n`` held-out prompts of every tag (all colour-shape pairs) with their ground-truth scenes."""
    rng, every = np.random.default_rng(seed), allowed_pairs(())
    out = []
    for i in range(n):
        md = sample_metadata(rng, TAGS[i % len(TAGS)], every)
        out.append((md, scene_for(md, rng, every)))
    return out


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """These small models train several times faster on one thread when the machine's other core is busy
    (two threads spin against the neighbour); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def short_clip() -> tuple[WorldCLIPConfig, TrainedRewardModel]:
    """A tiny CLIP trained for 100 steps on every tag."""
    cfg = tiny_clip_config(steps=100, batch_size=32, lr=3e-3, warmup_steps=10)
    return cfg, train_world_clip(cfg)


def test_hard_negative_each_tag_changes_one_attribute() -> None:
    rng, every = np.random.default_rng(0), allowed_pairs(())
    for tag in TAGS:
        for _ in range(20):
            caption = sample_metadata(rng, tag, every)["prompt"]
            kind, neg = hard_negative(caption, rng)
            assert neg != caption
            a, b = caption.split(" "), neg.split(" ")
            if kind != "text":
                changed = [(x, y) for x, y in zip(a, b, strict=True) if x != y]
                assert 1 <= len(changed) <= 2, (caption, neg)  # the attribute and maybe its article
                assert all(x in ("a", "an") for x, _ in changed[:-1])
    assert hard_negative("a photo of a circle left of a square", np.random.default_rng(0))[1] in {
        "a photo of a circle right of a square",
        "a photo of a triangle left of a square",
        "a photo of a circle left of a triangle",
    }
    for seed in range(30):  # articles follow the new word (no world colour or shape starts with a vowel now)
        words = hard_negative("a photo of a red circle", np.random.default_rng(seed))[1].split(" ")
        assert all(w == ("an" if n[0] in "aeiou" else "a") for w, n in itertools.pairwise(words) if w in ("a", "an"))


def test_degrade_every_kind_changes_image_keeps_uint8_shape() -> None:
    cfg = WorldPreferenceConfig()
    rng = np.random.default_rng(0)
    for kind in DEGRADATIONS:
        captions, good, bad, kinds = preference_pairs(rng, [kind] * 6, cfg, allowed_pairs(()), 32, augmented=False)
        assert good.dtype == bad.dtype == np.uint8 and good.shape == bad.shape == (6, 32, 32, 3)
        assert all((g != b).any() for g, b in zip(good, bad, strict=True)), kind
        assert kinds == [kind] * 6 and len(captions) == 6


def test_augment_and_blur_keep_uint8_shape() -> None:
    img = np.zeros((32, 32, 3), np.uint8)
    img[10:20, 10:20] = (230, 30, 30)
    out = augment(img, np.random.default_rng(0), **WorldAugmentConfig().model_dump())
    assert out.dtype == np.uint8 and out.shape == img.shape and (out != img).any()
    assert np.array_equal(gaussian_blur(img, 0.0), img)
    assert gaussian_blur(img, 1.0)[10, 15, 0] < 230 and gaussian_blur(img, 1.0)[9, 15, 0] > 0


def test_pixel_values_equal_processor() -> None:
    images = np.random.default_rng(0).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.3, 0.25)
    ref = build_processor(32, mean, std)(images=list(images), return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(pixel_values(images, mean, std), ref, rtol=0, atol=1e-6)


def test_clip_contrastive_loss_matches_reference_loop() -> None:
    g = torch.Generator().manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(3, 4, generator=g), dim=-1)
    txt = torch.nn.functional.normalize(torch.randn(5, 4, generator=g), dim=-1)  # 3 captions + 2 negatives
    scale = torch.tensor(math.log(10.0))
    same = torch.zeros(3, 5, dtype=torch.bool)
    same[torch.arange(3), torch.arange(3)] = True
    loss, m = clip_contrastive_loss(image_embeds=img, text_embeds=txt, logit_scale=scale, same_text=same)
    s = 10.0 * img @ txt.T
    i2t = -sum(s[b, b] - torch.logsumexp(s[b], 0) for b in range(3)) / 3
    t2i = -sum(s[b, b] - torch.logsumexp(s[:, b], 0) for b in range(3)) / 3
    torch.testing.assert_close(loss, (i2t + t2i) / 2)
    assert m["logit_scale"] == pytest.approx(10.0)
    # A repeated caption (text 2 == caption 0) is not a negative of image 0.
    same[0, 2] = True
    masked, _ = clip_contrastive_loss(image_embeds=img, text_embeds=txt, logit_scale=scale, same_text=same)
    keep = [0, 1, 3, 4]
    ref0 = -(s[0, 0] - torch.logsumexp(s[0, keep], 0))
    ref_i2t = (ref0 - sum(s[b, b] - torch.logsumexp(s[b], 0) for b in (1, 2))) / 3
    ref_t2i = -(s[0, 0] - torch.logsumexp(s[:, 0], 0) + s[1, 1] - torch.logsumexp(s[:, 1], 0)) / 3
    ref_t2i = ref_t2i - (s[2, 2] - torch.logsumexp(s[1:, 2], 0)) / 3  # image 0 is no negative of caption 2
    torch.testing.assert_close(masked, (ref_i2t + ref_t2i) / 2)


def test_bradley_terry_loss_is_logistic_on_score_gap() -> None:
    g = torch.Generator().manual_seed(1)
    t, p, r = (torch.nn.functional.normalize(torch.randn(4, 8, generator=g), dim=-1) for _ in range(3))
    loss, m = bradley_terry_loss(text_embeds=t, preferred_embeds=p, rejected_embeds=r, logit_scale=torch.tensor(2.0))
    gap = math.exp(2.0) * ((t * p).sum(-1) - (t * r).sum(-1))
    torch.testing.assert_close(loss, torch.nn.functional.softplus(-gap).mean())
    assert m["pair_acc"] == pytest.approx(float((gap > 0).float().mean()))


def test_train_world_clip_same_seed_gives_identical_weights() -> None:
    cfg = tiny_clip_config(steps=3)
    a, b = train_world_clip(cfg), train_world_clip(cfg)
    for (name, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
    assert [h["loss"] for h in a.history] == [h["loss"] for h in b.history]


def test_train_world_clip_short_run_loss_falls_and_beats_chance(short_clip: tuple) -> None:
    cfg, trained = short_clip
    losses = [h["loss"] for h in trained.history]
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.3
    m = evaluate_clip(
        trained.model,
        trained.tokenizer,
        mixed_records(128, seed=5),  # all pairs, the held-out ones included
        mean=cfg.image_mean,
        std=cfg.image_std,
        size=32,
        seed=0,
        negatives=2,
        batch=16,
    )
    assert m["pairwise_acc_per_attribute"]["color"] > 0.65, m
    assert m["in_batch_i2t_top1"] > 0.2, m  # chance: 1/16 plus repeated captions


def test_saved_dir_loads_with_from_pretrained(short_clip: tuple, tmp_path: Path) -> None:
    from transformers import CLIPImageProcessor, CLIPModel, CLIPTokenizer

    cfg, trained = short_clip
    out = save_reward_model(tmp_path / "clip", trained, {"note": "test"})
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "vocab.json", "merges.txt", "preprocessor_config.json"} <= files
    assert sum(p.stat().st_size for p in out.iterdir()) < 5 * 2**20
    assert not list(tmp_path.glob(".clip.*"))  # no temporary folder left behind
    model = CLIPModel.from_pretrained(out).eval()
    tok, proc = CLIPTokenizer.from_pretrained(out), CLIPImageProcessor.from_pretrained(out)
    assert proc.crop_size == {"height": 32, "width": 32} and model.config.vision_config.image_size == 32
    images = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    px = proc(images=list(images), return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(px, pixel_values(images, cfg.image_mean, cfg.image_std), rtol=0, atol=1e-6)
    captions = ["a photo of a red circle", "a photo of a blue square"]
    assert tok(captions)["input_ids"] == trained.tokenizer(captions)["input_ids"]
    bpe_only = tmp_path / "bpe"  # vocab.json + merges.txt alone give the same ids as tokenizer.json
    bpe_only.mkdir()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        (bpe_only / name).write_bytes((out / name).read_bytes())
    assert CLIPTokenizer.from_pretrained(bpe_only)(captions)["input_ids"] == tok(captions)["input_ids"]
    enc = tok(captions, padding="max_length", return_tensors="pt")
    with torch.no_grad():
        got = model(pixel_values=px, **enc).logits_per_image
        want = trained.model(pixel_values=px, **enc).logits_per_image
    torch.testing.assert_close(got, want)


def test_train_world_preference_short_run_beats_chance_on_blur(short_clip: tuple, tmp_path: Path) -> None:
    _, trained = short_clip
    clip_dir = save_reward_model(tmp_path / "clip", trained, {})
    cfg = WorldPreferenceConfig(
        steps=25,
        batch_size=16,
        lr=1e-3,
        warmup_steps=3,
        degradations=("blur",),
        tags=("colors",),
        eval_pairs_per_kind=48,
    )
    pick = train_world_preference(cfg, clip_dir)
    losses = [h["loss"] for h in pick.history]
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    m = evaluate_preference(pick.model, pick.tokenizer, evaluation_pairs(cfg, 32), mean=(0.5,) * 3, std=(0.5,) * 3)
    assert m["pair_acc_per_kind"]["blur"] > 0.7, m


def test_cli_bad_params_and_missing_clip_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vgrpo.world.cli import main

    bad = tmp_path / "rewards.yaml"
    bad.write_text("world_clip:\n  stepz: 3\n")
    assert (
        main(["train-world-clip", "--params", str(bad), "--splits", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    )
    assert "stepz" in capsys.readouterr().err
    args = ["train-world-preference", "--params", str(bad), "--clip", str(tmp_path / "none"), "--out", str(tmp_path)]
    assert main(args) == 2
    assert "not a world CLIP directory" in capsys.readouterr().err


def test_shipped_rewards_params_load_and_spell_out_every_value() -> None:
    import yaml

    from vgrpo.config import load_config
    from vgrpo.world.config import WorldRewardModelsConfig

    path = Path(__file__).parents[2] / "params" / "embedded" / "rewards.yaml"
    cfg = load_config([path], schema=WorldRewardModelsConfig)
    raw = yaml.safe_load(path.read_text())
    for section, model in (("world_clip", cfg.world_clip), ("world_pickscore", cfg.world_pickscore)):
        assert set(raw[section]) == set(type(model).model_fields), section
        assert set(raw[section]["augment"]) == set(WorldAugmentConfig.model_fields), section
