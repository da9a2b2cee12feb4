"""Scene vocabulary and sampling for the procedural text-to-image world.

The world mirrors the object/attribute structure of GenEval (Ghosh et al. 2023) -- classes, counts,
colours and pairwise positions -- with a tiny vocabulary of flat shapes that a deterministic detector
(:mod:`vgrpo.world.detect`) can verify exactly. Geometry is stored in canvas fractions so a scene can be
rendered at any resolution; pure numpy, seeded with :class:`numpy.random.Generator`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
"""Object classes; their bounding-box fills (about 0.7, 1 and 0.55) keep them apart at 9 px."""

PLURALS: dict[str, str] = {"circle": "circles", "square": "squares", "triangle": "triangles"}

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (230, 30, 30),
    "green": (30, 200, 40),
    "blue": (40, 70, 235),
    "yellow": (240, 225, 30),
}
"""Object colours: well separated in RGB (min pairwise distance > 190) and far from background and text."""

COLORS: tuple[str, ...] = tuple(PALETTE)
BACKGROUND: tuple[int, int, int] = (0, 0, 0)
TEXT_COLOR: tuple[int, int, int] = (255, 255, 255)

GRID = 3
"""Objects sit in the cells of a ``GRID x GRID`` layout (docs/embedded.md explains the choice)."""
CELL_CENTERS: tuple[float, ...] = (6 / 32, 16 / 32, 26 / 32)
"""Cell centres as canvas fractions: 10-pixel cells from pixel 1 at 32x32."""
OBJECT_SIZE = 9 / 32
"""Object side as a canvas fraction: 9 px at 32x32, a pixel of margin inside each 10-pixel cell."""
TEXT_BAND = 0.28
"""Bottom fraction of the canvas reserved for rendered text when a scene has any (9 px at 32x32: a 7 px glyph
row and a pixel above and below); text scenes use the two upper rows of cells only."""
GAP = 0.02
"""Minimum empty margin between object boxes (the one-pixel gap between neighbouring cells at 32x32)."""


@dataclass(frozen=True)
class ObjectSpec:
    """One flat object: ``shape`` in :data:`SHAPES`, ``color`` in :data:`COLORS`, centre ``(x, y)`` and side
    ``size``, all as fractions of the canvas (``y`` grows downward, as in image coordinates)."""

    shape: str
    color: str
    x: float
    y: float
    size: float

    def box(self) -> tuple[float, float, float, float]:
        """Bounding box ``(x0, y0, x1, y1)`` in canvas fractions."""
        h = self.size / 2
        return (self.x - h, self.y - h, self.x + h, self.y + h)


@dataclass(frozen=True)
class Scene:
    """A set of non-overlapping objects plus optional rendered text (the OCR target)."""

    objects: tuple[ObjectSpec, ...]
    text: str | None = None


def boxes_clear(a: ObjectSpec, b: ObjectSpec, gap: float = GAP) -> bool:
    """True when the boxes of ``a`` and ``b`` are separated by at least ``gap`` along some axis."""
    ax0, ay0, ax1, ay1 = a.box()
    bx0, by0, bx1, by1 = b.box()
    return ax1 + gap <= bx0 or bx1 + gap <= ax0 or ay1 + gap <= by0 or by1 + gap <= ay0


def grid_cells(has_text: bool = False) -> list[tuple[int, int]]:
    """``(column, row)`` of every free cell; a scene with text leaves the bottom row to the text band."""
    rows = GRID - 1 if has_text else GRID
    return [(col, row) for row in range(rows) for col in range(GRID)]


def object_at(cell: tuple[int, int], shape: str, color: str) -> ObjectSpec:
    """The object ``shape`` of ``color`` centred in ``cell``."""
    col, row = cell
    return ObjectSpec(shape=shape, color=color, x=CELL_CENTERS[col], y=CELL_CENTERS[row], size=OBJECT_SIZE)


def place_objects(
    rng: np.random.Generator, kinds: list[tuple[str, str]], *, has_text: bool = False
) -> tuple[ObjectSpec, ...]:
    """Put each ``(shape, color)`` in its own cell, cells drawn uniformly without replacement."""
    cells = grid_cells(has_text)
    if len(kinds) > len(cells):
        raise ValueError(f"{len(kinds)} objects do not fit in {len(cells)} cells")
    order = rng.permutation(len(cells))[: len(kinds)]
    return tuple(object_at(cells[int(i)], shape, color) for i, (shape, color) in zip(order, kinds, strict=True))


def random_scene(rng: np.random.Generator, n_objects: int, text: str | None = None) -> Scene:
    """A scene of ``n_objects`` uniformly random shapes and colours."""
    kinds = [(str(rng.choice(SHAPES)), str(rng.choice(COLORS))) for _ in range(n_objects)]
    return Scene(objects=place_objects(rng, kinds, has_text=text is not None), text=text)
