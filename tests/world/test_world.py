"""Procedural world: deterministic renders, GenEval-format metadata, held-out splits, and the exact detector
(GenEval strict accuracy on ground-truth renders vs. pure noise; Flow-GRPO partial-credit golden values)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vgrpo.world import (
    EXTRA_TAGS,
    GENEVAL_TAGS,
    SHAPES,
    Detection,
    detect,
    geneval_partial,
    geneval_strict,
    make_splits,
    read_jsonl,
    render,
    sample_metadata,
    scene_for,
    scene_from_dict,
    scene_to_dict,
    write_jsonl,
)
from vgrpo.world.prompts import Pair
from vgrpo.world.scene import COLORS

HELD: tuple[Pair, ...] = (("red", "triangle"), ("blue", "circle"))
ALL_PAIRS = [(c, s) for c in COLORS for s in SHAPES]


def _pairs(md: dict, scene) -> set[Pair]:
    named = {(r["color"], r["class"]) for r in md.get("include", []) if "color" in r}
    return named | {(o.color, o.shape) for o in scene.objects}


@pytest.fixture(scope="module")
def splits():
    return make_splits(seed=7, n_train=300, n_test=360, held_out_pairs=HELD)


def test_render_deterministic() -> None:
    md = sample_metadata(np.random.default_rng(0), "color_attr", ALL_PAIRS)
    a = render(scene_for(md, np.random.default_rng(1)))
    b = render(scene_for(md, np.random.default_rng(1)))
    assert a.dtype == np.uint8 and a.shape == (32, 32, 3)
    assert np.array_equal(a, b)
    assert render(scene_for(md, np.random.default_rng(1)), size=64).shape == (64, 64, 3)


def test_ocr_text_is_drawn_and_ignored_by_detector() -> None:
    rng = np.random.default_rng(3)
    md = sample_metadata(rng, "ocr", ALL_PAIRS)
    assert md["text"] in md["prompt"] and f'"{md["text"]}"' in md["prompt"]
    scene = scene_for(md, rng)
    img = render(scene)
    assert (img == 255).all(-1).sum() > 0  # white glyph pixels
    assert np.array_equal(img, render(scene))
    assert len(detect(img)) == len(scene.objects)


def test_preference_caption_scene_satisfies_its_clauses() -> None:
    rng = np.random.default_rng(11)
    for _ in range(30):
        md = sample_metadata(rng, "preference", ALL_PAIRS)
        assert not md["prompt"].startswith("a photo of")
        assert geneval_strict(md, detect(render(scene_for(md, rng))))


def test_metadata_and_scene_jsonl_roundtrip(tmp_path: Path, splits) -> None:
    train, _ = splits
    rng = np.random.default_rng(5)
    records = [md for md, _ in train[:60]] + [sample_metadata(rng, t, ALL_PAIRS) for t in EXTRA_TAGS * 3]
    path = tmp_path / "sub" / "meta.jsonl"
    write_jsonl(path, records)
    assert read_jsonl(path) == records
    assert [p.name for p in path.parent.iterdir()] == ["meta.jsonl"]  # no temp file left behind
    for md in records:
        assert json.loads(json.dumps(md)) == md
    scenes = [scene_to_dict(s) for _, s in train[:20]]
    write_jsonl(tmp_path / "scenes.jsonl", scenes)
    assert [scene_from_dict(d) for d in read_jsonl(tmp_path / "scenes.jsonl")] == [s for _, s in train[:20]]


def test_geneval_format_and_phrasing(splits) -> None:
    _, test = splits
    by_tag = {md["tag"]: md for md, _ in test}
    assert set(by_tag) == set(GENEVAL_TAGS)
    for md, _ in test:
        assert md["prompt"].startswith("a photo of ")
        for r in md["include"]:
            assert r["class"] in SHAPES and isinstance(r["count"], int)
    cnt = by_tag["counting"]
    assert cnt["exclude"] == [{"class": cnt["include"][0]["class"], "count": cnt["include"][0]["count"] + 1}]
    pos = by_tag["position"]
    rel = pos["include"][1]["position"]
    assert rel[1] == 0 and rel[0] in ("left of", "right of", "above", "below")
    assert f" {rel[0]} " in pos["prompt"]


def test_splits_reproducible_and_hold_out_pairs(splits) -> None:
    train, test = splits
    train2, test2 = make_splits(seed=7, n_train=300, n_test=360, held_out_pairs=HELD)
    assert train == train2 and test == test2
    assert make_splits(seed=8, n_train=30, n_test=0, held_out_pairs=HELD)[0] != train[:30]
    train_pairs = set().union(*(_pairs(md, s) for md, s in train))
    test_pairs = set().union(*(_pairs(md, s) for md, s in test))
    assert not train_pairs & set(HELD)
    assert set(HELD) <= test_pairs
    named_tests = [md for md, _ in test if md["tag"] in ("colors", "color_attr")]
    assert all(any((r["color"], r["class"]) in HELD for r in md["include"]) for md in named_tests)


def test_detector_strict_accuracy_on_renders_and_noise(splits) -> None:
    _, test = splits
    assert len(test) >= 300
    acc = float(np.mean([geneval_strict(md, detect(render(scene))) for md, scene in test]))
    assert acc >= 0.98, acc
    rng = np.random.default_rng(0)
    noise = [rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8) for _ in test]
    noise_acc = float(np.mean([geneval_strict(md, detect(img)) for (md, _), img in zip(test, noise, strict=True)]))
    assert noise_acc <= 0.05, noise_acc


def test_detector_recovers_every_object(splits) -> None:
    _, test = splits
    for _, scene in test[:120]:
        got = sorted((d.shape, d.color) for d in detect(render(scene)))
        assert got == sorted((o.shape, o.color) for o in scene.objects)


COUNT_THREE_RINGS = {
    "tag": "counting",
    "include": [{"class": "ring", "count": 3}],
    "exclude": [{"class": "ring", "count": 4}],
    "prompt": "a photo of three rings",
}


def _det(shape: str, color: str, x: int, y: int, side: int = 8) -> Detection:
    return Detection(shape=shape, color=color, box=(x, y, x + side, y + side))


def test_strict_rules() -> None:
    rings = [_det("ring", "red", 10 * i, 0) for i in range(4)]
    assert geneval_strict(COUNT_THREE_RINGS, rings[:3])
    assert not geneval_strict(COUNT_THREE_RINGS, rings[:2])
    assert not geneval_strict(COUNT_THREE_RINGS, rings)
    single = {"tag": "single_object", "include": [{"class": "ring", "count": 1}], "prompt": "a photo of a ring"}
    assert geneval_strict(single, rings)  # at least `count` outside the counting tag
    pos = {
        "tag": "position",
        "include": [{"class": "square", "count": 1}, {"class": "cross", "count": 1, "position": ["left of", 0]}],
        "prompt": "a photo of a cross left of a square",
    }
    assert geneval_strict(pos, [_det("square", "blue", 20, 10), _det("cross", "red", 2, 12)])
    assert not geneval_strict(pos, [_det("square", "blue", 2, 10), _det("cross", "red", 20, 12)])
    assert not geneval_strict(pos, [_det("square", "blue", 10, 2), _det("cross", "red", 10, 20)])  # below


def test_partial_credit_golden_values() -> None:
    rings = [_det("ring", "red", 10 * i, 0) for i in range(6)]
    # count clause 1 - |3-2|/3 = 2/3, exclude clause 1 -> mean 5/6
    assert geneval_partial(COUNT_THREE_RINGS, rings[:2]) == pytest.approx((2 / 3 + 1) / 2)
    assert geneval_partial(COUNT_THREE_RINGS, rings[:3]) == pytest.approx(1.0)
    assert geneval_partial(COUNT_THREE_RINGS, rings[:5]) == pytest.approx((1 / 3 + 0) / 2)
    assert geneval_partial(COUNT_THREE_RINGS, rings[:6]) == pytest.approx(0.0)  # 1 - 3/3 = 0, exclude fails
    assert geneval_partial(COUNT_THREE_RINGS, []) == pytest.approx(0.5)  # count 0, exclude holds
    attr = {
        "tag": "color_attr",
        "include": [{"class": "circle", "count": 1, "color": "red"}, {"class": "square", "count": 1, "color": "blue"}],
        "prompt": "a photo of a red circle and a blue square",
    }
    # circle: count 1, colour 1; square: count 1, colour 0 -> 3/4
    assert geneval_partial(attr, [_det("circle", "red", 0, 0), _det("square", "green", 20, 20)]) == pytest.approx(0.75)
    pos = {
        "tag": "position",
        "include": [{"class": "square", "count": 1}, {"class": "cross", "count": 1, "position": ["above", 0]}],
        "prompt": "a photo of a cross above a square",
    }
    # both present (1, 1) but cross is below the square (0) -> 2/3
    assert geneval_partial(pos, [_det("square", "blue", 10, 2), _det("cross", "red", 10, 20)]) == pytest.approx(2 / 3)
    assert geneval_partial(pos, [_det("square", "blue", 10, 20), _det("cross", "red", 10, 2)]) == pytest.approx(1.0)
