"""GenEval's clause vocabulary (Ghosh et al. 2023): the six prompt tags, a detection, and relative position.

The ground floor that GenEval scoring (:mod:`vgrpo.rewards.geneval`) and anything that makes or detects
GenEval scenes (the embedded world, :mod:`vgrpo.world`) both import, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["GENEVAL_TAGS", "Box", "Detection", "relative_position"]

GENEVAL_TAGS: tuple[str, ...] = ("single_object", "two_object", "counting", "colors", "position", "color_attr")

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class Detection:
    """One detected object.

    Attributes:
        label: class name (GenEval's ``object_names.txt`` for real images; the world's shapes).
        box: ``(x0, y0, x1, y1)`` in pixels.
        score: detector confidence in [0, 1].
        color: colour name when known (the world detector reads it exactly; the Mask2Former detector fills it
            with CLIP zero-shot colour on the masked crop for classes a colour clause asks about), else None.
    """

    label: str
    box: Box
    score: float = 1.0
    color: str | None = None

    @property
    def center(self) -> tuple[float, float]:
        x0, y0, x1, y1 = self.box
        return ((x0 + x1) / 2, (y0 + y1) / 2)


def relative_position(a: Detection, b: Detection, threshold: float = 0.1) -> set[str]:
    """GenEval's ``relative_position``: relations of ``a`` to ``b`` from box centres, the offset shrunk by
    ``threshold * (dim_a + dim_b)`` per axis; a relation holds when its normalised component exceeds 0.5."""
    boxes = np.array([a.box, b.box], dtype=np.float64).reshape(2, 2, 2)
    center_a, center_b = boxes.mean(axis=-2)
    dim_a, dim_b = np.abs(np.diff(boxes, axis=-2))[..., 0, :]
    offset = center_a - center_b
    revised = np.maximum(np.abs(offset) - threshold * (dim_a + dim_b), 0) * np.sign(offset)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    rels: set[str] = set()
    if dx < -0.5:
        rels.add("left of")
    if dx > 0.5:
        rels.add("right of")
    if dy < -0.5:
        rels.add("above")
    if dy > 0.5:
        rels.add("below")
    return rels
