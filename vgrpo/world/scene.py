"""Scene vocabulary and sampling for the procedural text-to-image world.

The world mirrors the object/attribute structure of GenEval (Ghosh et al. 2023) -- classes, counts,
colours and pairwise positions -- with a tiny vocabulary of flat shapes that a deterministic detector
(:mod:`vgrpo.world.detect`) can verify exactly. Geometry is stored in canvas fractions so a scene can be
rendered at any resolution; pure numpy, seeded with :class:`numpy.random.Generator`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "cross", "ring")
"""Object classes; each is separable at 32x32 by bounding-box fill, row profile and holes."""

PLURALS: dict[str, str] = {
    "circle": "circles",
    "square": "squares",
    "triangle": "triangles",
    "cross": "crosses",
    "ring": "rings",
}

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (230, 30, 30),
    "green": (30, 200, 40),
    "blue": (40, 70, 235),
    "yellow": (240, 225, 30),
    "purple": (160, 40, 210),
    "orange": (250, 140, 20),
}
"""Object colours: well separated in RGB (min pairwise distance > 90) and far from background and text."""

COLORS: tuple[str, ...] = tuple(PALETTE)
BACKGROUND: tuple[int, int, int] = (0, 0, 0)
TEXT_COLOR: tuple[int, int, int] = (255, 255, 255)

MIN_SIZE = 0.28
"""Smallest object side as a canvas fraction (9 px at 32x32): objects span about three 4-pixel transformer
patches, so a small model can learn their outlines (at 7 px it drew blobs)."""
MAX_SIZE = 0.36
GAP = 0.07
"""Minimum empty margin between object boxes (about 2 px at 32x32) so components never touch."""
TEXT_BAND = 0.28
"""Bottom fraction of the canvas reserved for rendered text when a scene has any (9 px at 32x32: a 7 px glyph
row and a pixel above and below)."""


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


def sample_object(
    rng: np.random.Generator, shape: str, color: str, *, has_text: bool = False, margin: float = 0.03
) -> ObjectSpec:
    """Sample size and position for one object that fits inside the canvas (above the text band if any)."""
    size = float(rng.uniform(MIN_SIZE, MAX_SIZE))
    lo = margin + size / 2
    y_hi = (1.0 - TEXT_BAND if has_text else 1.0) - margin - size / 2
    x = float(rng.uniform(lo, 1.0 - lo))
    y = float(rng.uniform(lo, y_hi))
    return ObjectSpec(shape=shape, color=color, x=x, y=y, size=size)


def place_objects(
    rng: np.random.Generator,
    kinds: list[tuple[str, str]],
    *,
    has_text: bool = False,
    max_tries: int = 2000,
) -> tuple[ObjectSpec, ...]:
    """Place ``(shape, color)`` objects without overlap by rejection sampling (restarting on dead ends)."""
    for _ in range(max_tries):
        placed: list[ObjectSpec] = []
        for shape, color in kinds:
            for _ in range(50):
                cand = sample_object(rng, shape, color, has_text=has_text)
                if all(boxes_clear(cand, p) for p in placed):
                    placed.append(cand)
                    break
            else:
                break
        if len(placed) == len(kinds):
            return tuple(placed)
    raise RuntimeError(f"could not place {len(kinds)} objects without overlap")


def random_scene(rng: np.random.Generator, n_objects: int, text: str | None = None) -> Scene:
    """A scene of ``n_objects`` uniformly random shapes and colours."""
    kinds = [(str(rng.choice(SHAPES)), str(rng.choice(COLORS))) for _ in range(n_objects)]
    return Scene(objects=place_objects(rng, kinds, has_text=text is not None), text=text)
