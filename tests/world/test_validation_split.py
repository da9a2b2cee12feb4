"""The validation split that recipe selection reads: drawn as the test split is, disjoint from it by prompt text
wherever the world's vocabulary leaves a text to spare, and otherwise by its images (another noise seed)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from vgrpo.config import load_config, load_curriculum, read_params
from vgrpo.evaluation.config import EvaluationConfig
from vgrpo.world.config import PretrainConfig
from vgrpo.world.prompts import closed_tags, make_splits, make_validation, write_splits

REPO = Path(__file__).resolve().parents[2]
PRETRAIN = load_config([REPO / "params/embedded/pretrain.yaml"], section="pretrain", schema=PretrainConfig)


@pytest.fixture(scope="module")
def shipped() -> tuple[list, list, list]:
    """The shipped train and test splits (params/embedded/pretrain.yaml) and the 560 validation rows dvc.yaml's
    world_splits writes."""
    cfg = PRETRAIN
    train, test = make_splits(
        cfg.seed, cfg.train_prompts, cfg.test_prompts, held_out_pairs=cfg.held_out_pairs, tags=cfg.split_tags
    )
    validation = make_validation(cfg.seed, 560, [md["prompt"] for md, _ in test], cfg.held_out_pairs, cfg.split_tags)
    return train, test, validation


def test_validation_is_disjoint_from_test_by_prompt_text_wherever_a_text_is_left(shipped: tuple) -> None:
    train, test, validation = shipped
    test_texts = {md["prompt"] for md, _ in test}
    by_tag = Counter(md["tag"] for md, _ in validation)
    assert by_tag == {tag: 80 for tag in PRETRAIN.split_tags}  # drawn as the test split: tags cycled, 80 each
    shared = Counter(md["tag"] for md, _ in validation if md["prompt"] in test_texts)
    # color_attr and ocr have texts the test split never shows: none of their validation rows repeats a test text.
    assert shared["color_attr"] == 0 and shared["ocr"] == 0
    assert len({md["prompt"] for md, _ in validation if md["tag"] == "ocr"}) == 69  # 69 words of 184 (test: 74)
    # The closed tags: the test split holds every text of theirs (3, 6, 9, 10 and 24 of them), so none is left.
    closed = closed_tags(validation, test_texts)
    assert closed == ["colors", "counting", "position", "single_object", "two_object"]
    for tag, size in {"single_object": 3, "two_object": 6, "counting": 9, "colors": 10, "position": 24}.items():
        assert len({md["prompt"] for md, _ in test if md["tag"] == tag}) == size
        train_texts = {md["prompt"] for md, _ in train if md["tag"] == tag}
        assert {md["prompt"] for md, _ in validation if md["tag"] == tag} <= train_texts
    # No held-out colour-shape pair (the probe's) is named by validation's colour prompts.
    held = [f"{c} {s}" for c, s in PRETRAIN.held_out_pairs]
    assert not [
        md for md, _ in validation if md["tag"] in ("colors", "color_attr") and any(h in md["prompt"] for h in held)
    ]


def test_validation_images_differ_from_tests_by_their_noise_seed() -> None:
    """The closed tags' rows share texts with the test split; their images must not: validation.yaml evaluates with
    seed 1, the test evaluation (evaluate.yaml, and each stage's model params) with seed 0."""
    overlay = REPO / "params/embedded/validation.yaml"
    test_eval = load_config([REPO / "params/embedded/evaluate.yaml"], section="evaluation", schema=EvaluationConfig)
    val_eval = load_config(
        [REPO / "params/embedded/evaluate.yaml", overlay], section="evaluation", schema=EvaluationConfig
    )
    assert (test_eval.seed, val_eval.seed) == (0, 1)
    assert val_eval.model_copy(update={"seed": 0}) == test_eval  # nothing else differs
    assert read_params(overlay)["eval_prompts"] == "data/world/validation.jsonl"


def test_recipe_selection_curricula_evaluate_on_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    experiments = (REPO / "params/experiments/curricula").glob("embedded-validation*.yaml")
    tuning = [*sorted(str(p.relative_to(REPO)) for p in experiments), "params/curricula/embedded-validation.yaml"]
    assert len(tuning) >= 4  # every variant for tuning, the shipped stages' and each lever's
    for curriculum in ("params/curricula/embedded-ablation.yaml", *tuning):
        _, stages = load_curriculum(curriculum)
        assert {(s.eval_prompts, s.evaluation.seed) for s in stages} == {("data/world/validation.jsonl", 1)}
    _, report = load_curriculum("params/curricula/embedded.yaml")  # the final report reads test
    assert {(s.eval_prompts, s.evaluation.seed) for s in report} == {("data/world/test.jsonl", 0)}
    _, validation = load_curriculum("params/curricula/embedded-validation.yaml")
    trained = [s.model_dump(exclude={"eval_prompts", "evaluation"}) for s in validation]
    assert trained == [s.model_dump(exclude={"eval_prompts", "evaluation"}) for s in report]  # the same training
    untuned = {"eval_prompts", "evaluation", "name"}  # a stage's name does not enter its training's numbers
    _, runs = load_curriculum(
        "params/experiments/curricula/embedded-validation-kl3.yaml"
    )  # metrics/curriculum_runs.json's
    assert [s.model_dump(exclude=untuned) for s in runs] == [s.model_dump(exclude=untuned) for s in report]
    _, v3 = load_curriculum(
        "params/experiments/curricula/embedded-validation-v3.yaml"
    )  # shipped until the KL: every lever's base
    assert [s.name for s in v3] == [s.name for s in report]
    assert [s.algorithm.ref_kl_coef for s in v3] == [0.0, 0.0, 0.0, 20.0, 0.0]
    assert [s.algorithm.ref_kl_coef for s in report] == [0.0, 8.0, 8.0, 20.0, 4.0]
    _, holding = load_curriculum("params/experiments/curricula/embedded-validation-hold.yaml")
    unheld = [s.model_dump(exclude={"eval_prompts", "evaluation", "hold"}) for s in v3]
    assert [s.model_dump(exclude={"eval_prompts", "evaluation", "hold"}) for s in holding] == unheld
    tolerances = {"geneval_strict": 0.03, "geneval_partial": 0.03, "ocr": 0.03, "world_clipscore": 0.05}
    for stage in holding:
        assert stage.hold is not None and stage.hold.rewards == {**tolerances, "world_pickscore": 0.5}
        assert (stage.hold.prompts, stage.hold.every, stage.eval_prompts) == (
            "data/world/validation.jsonl",
            10,
            "data/world/validation.jsonl",
        )


def test_writing_validation_leaves_the_other_splits_unchanged(tmp_path: Path) -> None:
    kw = {"held_out_pairs": PRETRAIN.held_out_pairs, "tags": PRETRAIN.split_tags, "n_probe": 6}
    assert write_splits(tmp_path / "a", 0, 70, 35, **kw) == (70, 35, 6, 0)
    assert write_splits(tmp_path / "b", 0, 70, 35, n_validation=14, **kw) == (70, 35, 6, 14)
    for name in ("train", "test", "probe"):
        assert (tmp_path / "a" / f"{name}.jsonl").read_bytes() == (tmp_path / "b" / f"{name}.jsonl").read_bytes()
    assert not (tmp_path / "a" / "validation.jsonl").exists()
    rows = [json.loads(line) for line in (tmp_path / "b" / "validation.jsonl").read_text().splitlines()]
    assert len(rows) == 14 and all("scene" in r for r in rows)  # ground-truth scenes, as the test split's
