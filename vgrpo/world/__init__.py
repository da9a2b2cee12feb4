"""Procedural text-to-image world with exactly verifiable rewards (GenEval-style metadata, flat shapes).

See :mod:`vgrpo.world.scene` (vocabulary), :mod:`vgrpo.world.render` (rasteriser and bitmap font),
:mod:`vgrpo.world.prompts` (GenEval / OCR / preference prompts and splits) and :mod:`vgrpo.world.detect`
(exact detector, GenEval strict score and Flow-GRPO partial credit)."""

from vgrpo.world.detect import Detection, detect, geneval_partial, geneval_strict, relative_position
from vgrpo.world.prompts import (
    EXTRA_TAGS,
    GENEVAL_TAGS,
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
    "Detection",
    "ObjectSpec",
    "Scene",
    "detect",
    "geneval_partial",
    "geneval_strict",
    "make_splits",
    "read_jsonl",
    "relative_position",
    "render",
    "sample_metadata",
    "scene_for",
    "scene_from_dict",
    "scene_to_dict",
    "write_jsonl",
]
