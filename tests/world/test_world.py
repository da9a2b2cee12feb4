"""Procedural world: deterministic renders, GenEval-format metadata, held-out splits, and the exact detector
(GenEval strict accuracy on ground-truth renders vs. pure noise; the scoring rules are in tests/rewards)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vgrpo.rewards.geneval_rules import score_detections
from vgrpo.world import (
    EXTRA_TAGS,
    GENEVAL_TAGS,
    SHAPES,
    detect,
    make_probe,
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


def geneval_strict(md: dict, image: np.ndarray) -> bool:
    return score_detections(md, detect(image)).correct


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
        assert geneval_strict(md, render(scene_for(md, rng)))


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
    assert not train_pairs & set(HELD)
    # The headline test prompts name seen pairs only; the probe names a held-out pair in every prompt.
    named = {(r["color"], r["class"]) for md, _ in test for r in md.get("include", []) if "color" in r}
    assert named and not named & set(HELD)
    probe = make_probe(7, 40, HELD)
    assert probe == make_probe(7, 40, HELD) and [md["tag"] for md, _ in probe[:4]] == ["colors", "color_attr"] * 2
    assert all(any((r["color"], r["class"]) in HELD for r in md["include"]) for md, _ in probe)
    assert all(geneval_strict(md, render(scene)) for md, scene in probe)


def test_detector_strict_accuracy_on_renders_and_noise(splits) -> None:
    _, test = splits
    assert len(test) >= 300
    acc = float(np.mean([geneval_strict(md, render(scene)) for md, scene in test]))
    assert acc >= 0.98, acc
    rng = np.random.default_rng(0)
    noise = [rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8) for _ in test]
    noise_acc = float(np.mean([geneval_strict(md, img) for (md, _), img in zip(test, noise, strict=True)]))
    assert noise_acc <= 0.05, noise_acc


def test_detector_recovers_every_object(splits) -> None:
    _, test = splits
    for _, scene in test[:120]:
        got = sorted((d.label, d.color) for d in detect(render(scene)))
        assert got == sorted((o.shape, o.color) for o in scene.objects)


def test_detector_quality_meets_the_world_targets(splits) -> None:
    from vgrpo.world.quality import detector_quality

    _, test = splits
    q = detector_quality(test)
    assert q["ground_truth"] == 1.0 and q["noise"] <= 0.01 and q["wrong_prompt"] <= 0.05, q
    assert all(row["wrong_prompt"] <= 0.2 for row in q["per_tag"].values()), q["per_tag"]
    blurred = detector_quality(test[:60], roundtrip=lambda images: np.zeros_like(images))
    assert blurred["vae_roundtrip"] == 0.0  # a round trip that loses the image loses every object


def test_wrong_prompts_ask_for_something_else(splits) -> None:
    from vgrpo.world.quality import wrong_prompts

    metadata = [md for md, _ in splits[1]]
    for md, wrong in zip(metadata, wrong_prompts(metadata), strict=True):
        assert wrong is not None and wrong["tag"] == md["tag"] and wrong["include"] != md["include"]


def test_objects_sit_in_grid_cells_without_touching(splits) -> None:
    from vgrpo.world.scene import CELL_CENTERS, GRID, OBJECT_SIZE

    for _, scene in splits[0]:
        cells = {(CELL_CENTERS.index(o.x), CELL_CENTERS.index(o.y)) for o in scene.objects}
        assert len(cells) == len(scene.objects) <= GRID * GRID
        assert all(o.size == OBJECT_SIZE for o in scene.objects)
