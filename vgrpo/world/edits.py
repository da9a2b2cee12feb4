"""The world's counting-edit set (:mod:`vgrpo.counting_edit`'s task on the world): an editing task whose reward
the world verifies.

Each source is the ground-truth render of a world ``counting`` scene, the target count another of
:data:`vgrpo.counting_edit.EDIT_COUNTS`, and the metadata GenEval's counting clause for the target, so that the
world's GenEval reward (``geneval``, its detector) verifies the edit and ``source_similarity``
(:mod:`vgrpo.rewards.source`) what the edit keeps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vgrpo.counting_edit import counting_edit_row, draw_target, source_clause
from vgrpo.world.records import Record, write_jsonl
from vgrpo.world.render import render
from vgrpo.world.scene import PLURALS

__all__ = ["counting_edit", "write_counting_edits"]


def counting_edit(record: Record, rng: np.random.Generator, image: str) -> dict[str, Any]:
    """The edit row of one world ``counting`` record: its scene is the source (``image``, its path relative to the
    prompt file), the target count drawn by :func:`vgrpo.counting_edit.draw_target`."""
    metadata, scene = record
    shape, source_count = source_clause(metadata)
    if len(scene.objects) != source_count or any(o.shape != shape for o in scene.objects):
        raise ValueError(f"the scene of {metadata['prompt']!r} is not {source_count} {PLURALS[shape]}")
    return counting_edit_row(metadata, draw_target(source_count, rng), image, PLURALS[shape])


def write_counting_edits(
    splits: Mapping[str, Sequence[Record]], out: str | Path, *, seed: int = 0, size: int = 32
) -> dict[str, int]:
    """For each split of world records, ``out/<split>.jsonl`` with the edit rows of its ``counting`` records and
    their sources under ``out/images/<split>-NNNNN.png`` (``size`` px ground-truth renders); the split's target
    counts are drawn from ``seed`` and the split's name. Returns the rows written per split."""
    from vgrpo.evaluation.grids import write_png

    out = Path(out)
    written = {}
    for split, records in splits.items():
        rng = np.random.default_rng([seed, *split.encode()])
        rows: list[dict[str, Any]] = []
        for record in records:
            if record[0].get("tag") != "counting":
                continue
            image = f"images/{split}-{len(rows):05d}.png"
            write_png(out / image, render(record[1], size))
            rows.append(counting_edit(record, rng, image))
        write_jsonl(out / f"{split}.jsonl", rows)
        written[split] = len(rows)
    return written
