"""Procedural text-to-image world with exactly verifiable rewards (GenEval-style metadata, flat shapes).

See :mod:`vgrpo.world.scene` (vocabulary), :mod:`vgrpo.world.render` (rasteriser and bitmap font),
:mod:`vgrpo.world.prompts` (GenEval / OCR / preference prompts and splits) and :mod:`vgrpo.world.detect`
(exact detector; its detections are scored by :mod:`vgrpo.rewards.geneval`)."""

from vgrpo.world.detect import detect
from vgrpo.world.prompts import (
    EXTRA_TAGS,
    GENEVAL_TAGS,
    make_probe,
    make_splits,
    read_jsonl,
    sample_metadata,
    scene_for,
    scene_from_dict,
    scene_to_dict,
    write_jsonl,
)
from vgrpo.world.render import render
from vgrpo.world.scene import COLORS, PALETTE, SHAPES, ObjectSpec, Scene

__all__ = [
    "COLORS",
    "EXTRA_TAGS",
    "GENEVAL_TAGS",
    "PALETTE",
    "SHAPES",
    "ObjectSpec",
    "Scene",
    "detect",
    "make_probe",
    "make_splits",
    "read_jsonl",
    "render",
    "sample_metadata",
    "scene_for",
    "scene_from_dict",
    "scene_to_dict",
    "write_jsonl",
]
