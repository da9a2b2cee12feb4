"""The world detector reads what a generator or a VAE draws: blurred and desaturated objects as what they are,
near-shapes (domes, blobs) as nothing, two blurred neighbours of one colour as two; and mutated scenes, whose truth
is known, get the verdicts of their exact objects."""

from __future__ import annotations

import numpy as np
import pytest

from vgrpo.rewards.clauses import GENEVAL_TAGS
from vgrpo.world.degrade import gaussian_blur
from vgrpo.world.detect import _pieces, detect, shape_of
from vgrpo.world.prompts import make_splits
from vgrpo.world.quality import detector_quality, has_pair, mutation_check, mutations, ocr_check, perturbed
from vgrpo.world.render import render, shape_mask
from vgrpo.world.scene import PALETTE, SHAPES, Scene, object_at


def _canvas(mask: np.ndarray, color: tuple[int, int, int], at: tuple[int, int] = (11, 11)) -> np.ndarray:
    image = np.zeros((32, 32, 3), np.uint8)
    y, x = at
    image[y : y + mask.shape[0], x : x + mask.shape[1]][mask] = color
    return image


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("sigma", [0.0, 0.6, 0.9])
def test_a_blurred_object_reads_as_its_shape_and_colour(shape: str, sigma: float) -> None:
    for color, rgb in PALETTE.items():
        (found,) = detect(gaussian_blur(_canvas(shape_mask(shape, 9), rgb), sigma))
        assert (found.label, found.color) == (shape, color)


def test_a_desaturated_red_still_reads_red() -> None:
    (found,) = detect(_canvas(shape_mask("triangle", 9), (215, 70, 65)))
    assert (found.label, found.color) == ("triangle", "red")


def test_a_stepped_seven_pixel_triangle_is_a_triangle_not_a_square() -> None:
    stepped = np.array([[abs(x - 3) <= y // 2 + 1 for x in range(7)] for y in range(7)])
    assert shape_of(stepped) == "triangle"
    (found,) = detect(_canvas(stepped, PALETTE["blue"]))
    assert (found.label, found.color) == ("triangle", "blue")


def test_a_dome_and_a_blob_are_no_object() -> None:
    dome = shape_mask("square", 9).copy()
    dome[:4] = shape_mask("circle", 9)[:4]  # a half-disc on a rectangle: both bottom corners, no top corner
    assert 0.86 <= dome.mean() <= 0.93 and shape_of(dome) is None
    assert detect(_canvas(dome, PALETTE["blue"])) == []
    blob = np.random.default_rng(0).random((9, 9)) < 0.6
    assert detect(_canvas(blob, PALETTE["green"])) == []


def test_two_blurred_neighbours_of_one_colour_are_two_objects() -> None:
    scene = Scene((object_at((0, 2), "square", "blue"), object_at((1, 2), "square", "blue")))
    image = gaussian_blur(render(scene), 0.9)
    assert sorted((d.label, d.color, d.box[0]) for d in detect(image)) == [
        ("square", "blue", 2.0),
        ("square", "blue", 12.0),
    ]


def test_a_component_too_short_to_cut_stays_one_piece() -> None:
    mask = np.zeros((16, 16), bool)
    mask[2:5, 1:9] = True  # twice an object's side (4 px on a 16 px canvas) but too short for two 5-px parts
    assert _pieces(mask, side=4) == [(slice(2, 5), slice(1, 9))]
    image = np.zeros((16, 16, 3), np.uint8)
    image[mask] = PALETTE["red"]
    assert isinstance(detect(image), list)


def test_every_mutation_of_a_scene_changes_it_and_the_verdicts_follow_the_truth() -> None:
    _, test = make_splits(0, 0, 120)
    rng = np.random.default_rng(0)
    for _, scene in test:
        for kind, mutant in mutations(scene, rng).items():
            assert mutant != scene, kind
    checked = mutation_check(test, lambda images: np.stack([gaussian_blur(im, 0.7) for im in images]))
    assert checked["accuracy"] == 1.0 and checked["false_credit"] == 0.0
    assert checked["scenes"] > 2 * checked["truth_credited"] / 1.2  # most mutants break their prompt


def test_the_ocr_check_reads_ground_truth_exactly_and_a_blanked_round_trip_as_nothing() -> None:
    _, test = make_splits(0, 0, 70, tags=(*GENEVAL_TAGS, "ocr"))
    checked = ocr_check(test, lambda images: np.zeros_like(images))
    assert checked["images"] == 10
    assert checked["ground_truth"] == checked["ground_truth_exact"] == 1.0
    assert checked["vae_roundtrip"] == 0.0
    assert 0.0 <= checked["changed_by_one_level"] <= 1.0
    assert ocr_check([r for r in test if r[0]["tag"] != "ocr"]) == {}


def test_a_one_level_perturbation_moves_every_pixel_by_at_most_one_level() -> None:
    images = np.array([[[[0, 128, 255]]]], np.uint8).repeat(64, axis=1)
    moved = perturbed(images, np.random.default_rng(0)).astype(int) - images
    assert np.abs(moved).max() == 1 and (moved != 0).any()
    assert perturbed(images, np.random.default_rng(0))[..., 0].min() == 0  # clipped, not wrapped


def test_scenes_with_a_held_out_pair_are_counted_apart_from_the_round_trip() -> None:
    _, test = make_splits(0, 0, 140)
    held = {("red", "triangle"), ("blue", "circle")}
    unseen = np.array([has_pair(scene, held) for md, scene in test if md["tag"] != "ocr"])
    assert 0 < unseen.sum() < len(unseen)

    def blank_unseen(images: np.ndarray) -> np.ndarray:  # a VAE that loses every scene with a held-out pair
        return np.where(unseen[:, None, None, None], 0, images).astype(np.uint8)

    quality = detector_quality(test, roundtrip=blank_unseen, held_out=held)
    assert quality["vae_roundtrip"] == 1.0 and quality["vae_roundtrip_held_out_pairs"] == 0.0
    assert quality["images_held_out_pairs"] == unseen.sum()
    assert all(tag["vae_roundtrip"] == 1.0 for tag in quality["per_tag"].values())
    mixed = detector_quality(test, roundtrip=blank_unseen)
    assert "vae_roundtrip_held_out_pairs" not in mixed and mixed["vae_roundtrip"] < 1.0
    apart, together = mutation_check(test, held_out=held), mutation_check(test)
    assert apart["held_out_pairs"]["scenes"] + apart["scenes"] == together["scenes"]
    assert "held_out_pairs" not in together
