"""GenEval's ``extra_object_penalty``: the score loses the penalty per object the detector keeps beyond those the
prompt names (the clutter count of :mod:`vgrpo.world.clutter`), on hand-built detections and on world images; its
verdicts (``strict``, ``exact``, ``partial``) stay GenEval's and the server's, and without the option nothing
changes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from vgrpo.rewards.base import Metadata, RewardOutput
from vgrpo.rewards.clauses import Detection
from vgrpo.rewards.geneval import GenEvalReward
from vgrpo.rewards.geneval_rules import score_detections
from vgrpo.world.clutter import is_cluttered
from vgrpo.world.render import render
from vgrpo.world.scene import Scene, object_at

BENCH = {"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a photo of a bench"}
CUP_DOG = {
    "tag": "two_object",
    "include": [{"class": "cup", "count": 1}, {"class": "dog", "count": 1}],
    "prompt": "a photo of a cup and a dog",
}


def det(label: str, x: float, score: float = 0.9) -> Detection:
    return Detection(label=label, box=(x, 0.0, x + 20, 20.0), score=score)


# Image i's detections (the detector reads the image's first pixel as its index).
DETECTIONS: list[tuple[Metadata, list[Detection]]] = [
    (BENCH, [det("bench", 0)]),  # the named object alone
    (BENCH, [det("bench", 0), det("dog", 40)]),  # one extra object, of another class
    (BENCH, [det("bench", 0), det("dog", 40), det("cup", 80, score=0.2)]),  # + one GenEval does not keep (< 0.3)
    (BENCH, [det("bench", 0), det("bench", 40)]),  # an extra of the named class
    (CUP_DOG, [det("cup", 0), det("dog", 40), det("bench", 80), det("bird", 120)]),  # two extra
    (CUP_DOG, [det("cup", 0)]),  # a named object missing, nothing extra
]


class Recorded:
    def detect(self, images: np.ndarray, metadata: Sequence[Metadata]) -> list[list[Detection]]:
        return [DETECTIONS[int(image[0, 0, 0])][1] for image in images]


def _score(**options: Any) -> RewardOutput:
    images = np.stack([np.full((8, 8, 3), i, np.uint8) for i in range(len(DETECTIONS))])
    metadata = [md for md, _ in DETECTIONS]
    return GenEvalReward(detector=Recorded(), **options)(images, [str(md["prompt"]) for md in metadata], metadata)


def test_each_object_beyond_those_named_costs_the_penalty_and_the_verdicts_stay_genevals() -> None:
    assert [score_detections(md, dets).extra for md, dets in DETECTIONS] == [0, 1, 1, 1, 2, 0]
    plain = _score()
    np.testing.assert_array_equal(plain.sub_scores["strict"], [1, 1, 1, 1, 1, 0])  # GenEval lets clutter pass
    np.testing.assert_allclose(plain.sub_scores["partial"], [1, 1, 1, 0, 1, 0.5])
    priced = _score(extra_object_penalty=0.25)
    np.testing.assert_allclose(priced.scores, [1.0, 0.75, 0.75, -0.25, 0.5, 0.5])
    np.testing.assert_array_equal(priced.sub_scores["extra_objects"], [0, 1, 1, 1, 2, 0])
    for name in ("strict", "exact", "partial"):
        np.testing.assert_array_equal(priced.sub_scores[name], plain.sub_scores[name])
    strict = _score(reward="strict", extra_object_penalty=1.0)  # on the strict verdict: a clutter-free strict pass
    np.testing.assert_allclose(strict.scores, [1, 0, 0, 0, -1, 0])


def test_without_the_option_the_score_and_sub_scores_are_as_before() -> None:
    plain = _score()
    assert set(plain.sub_scores) == {"strict", "exact", "partial"}
    np.testing.assert_array_equal(plain.scores, plain.sub_scores["partial"])
    np.testing.assert_array_equal(_score(extra_object_penalty=0.0).scores, plain.scores)
    with pytest.raises(ValueError, match="extra_object_penalty must be >= 0"):
        GenEvalReward(detector=Recorded(), extra_object_penalty=-0.1)


def _image(*objects: tuple[tuple[int, int], str, str]) -> np.ndarray:
    return render(Scene(objects=tuple(object_at(cell, shape, color) for cell, shape, color in objects), text=None))


def test_on_world_images_the_count_is_the_clutter_benchmarks_and_comes_after_shaping() -> None:
    square: dict[str, Any] = {
        "tag": "single_object",
        "include": [{"class": "square", "count": 1}],
        "prompt": "a photo of a square",
    }
    alone = _image(((0, 0), "square", "green"))
    extra = _image(((0, 0), "square", "green"), ((2, 2), "circle", "blue"))
    assert not is_cluttered(alone, square) and is_cluttered(extra, square)
    reward = GenEvalReward(shaping_detectors=[{"min_iou": 0.3}], extra_object_penalty=0.5)
    out = reward(np.stack([alone, extra]), [square["prompt"]] * 2, [square, square])
    np.testing.assert_array_equal(out.sub_scores["extra_objects"], [0, 1])
    np.testing.assert_allclose(out.sub_scores["shaped"], [1.0, 1.0])
    np.testing.assert_allclose(out.scores, [1.0, 0.5])
