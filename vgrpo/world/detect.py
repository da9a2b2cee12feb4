"""The procedural world's detector; GenEval scoring of its detections is :mod:`vgrpo.rewards.geneval_rules`.

It has to read what a generator (or a VAE round trip) draws, not only exact renders: edges blurred into the
black background, colours a little desaturated, two neighbouring objects of one colour bridged by a pixel of
blur. So :func:`detect`

1. gives each pixel a colour by its hue, among the palette's four, when its chroma (``max - min`` of RGB) is at
   least :data:`MIN_CHROMA` and its hue within :data:`HUE_TOLERANCE` degrees of the colour's: blur darkens a
   pixel and desaturation greys it, and neither moves its hue much, while the black background and the white
   text have no hue at all;
2. labels the 8-connected components of each colour, drops those under :data:`MIN_AREA` pixels, and cuts a
   component longer than :data:`MAX_ASPECT` times an object's side at its thinnest line (two objects bridged);
3. names each component's shape by what survives blur: how much of its bounding box it fills, how its mass
   divides between top and bottom, and which corners of the box it covers (:func:`shape_of`). A component
   that is none of the three, a dome or a blob, is no object; nor is one whose template IoU (its mask against
   the renderer's raster of that shape) is under ``min_iou``.

Colour and shape must both be right for an object to count, as GenEval's Mask2Former plus CLIP colour
classifier require. Every detection has confidence 1 (it passes GenEval's 0.3 and counting 0.9 thresholds);
detections come best template fit first, the order GenEval's "most confident first" rule then picks from.
A looser detector (``min_iou`` under :data:`MIN_IOU`, for reward shaping) names shapes by template IoU alone,
so that near-misses earn part of a shaped reward; GenEval's verdicts use the default.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import ndimage

from vgrpo.rewards.clauses import Detection, Vocabulary
from vgrpo.world.render import shape_mask
from vgrpo.world.scene import COLORS, OBJECT_SIZE, PALETTE, SHAPES

__all__ = ["HUES", "MIN_IOU", "WorldDetector", "best_fit", "color_labels", "detect", "shape_of"]

MIN_CHROMA = 60.0
"""A pixel has a colour only when ``max(RGB) - min(RGB)`` reaches this (the background's blur halo stays under
30, an object's blurred edge over 90, on the base VAE's round trips of ground truth)."""
HUE_TOLERANCE = 30.0
"""Degrees of hue a pixel may be from its colour's (the palette's hues are 56 or more apart)."""
MIN_AREA = 16
"""Components with fewer pixels are ignored (noise specks, font strokes)."""
MIN_SIDE = 5
MAX_ASPECT = 1.4
"""A component's box may be this much longer than wide (a longer one is cut, or is no object)."""
MIN_IOU = 0.6
"""A component is an object only when its mask's IoU with the template of its shape reaches this."""


def _hue(rgb: tuple[int, int, int]) -> float:
    return float(hue_and_chroma(np.array(rgb, dtype=np.uint8).reshape(1, 1, 3))[0][0, 0])


def hue_and_chroma(image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-pixel HSV hue in degrees ``[0, 360)`` and chroma ``max - min`` (0-255) of a uint8 ``(H, W, 3)``
    image."""
    x = image.astype(np.float64)
    high, low = x.max(-1), x.min(-1)
    chroma = high - low
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    safe = np.where(chroma > 0, chroma, 1.0)
    hue = np.where(high == r, ((g - b) / safe) % 6, np.where(high == g, (b - r) / safe + 2, (r - g) / safe + 4))
    return np.where(chroma > 0, hue * 60.0, 0.0), chroma


HUES: dict[str, float] = {color: _hue(PALETTE[color]) for color in COLORS}
"""Each palette colour's hue in degrees."""
_HUE_ARR = np.array([HUES[c] for c in COLORS])
_STRUCT8 = np.ones((3, 3), dtype=bool)


def color_labels(image: np.ndarray) -> np.ndarray:
    """Per-pixel index into :data:`COLORS` of the colour whose hue is nearest, or -1 for a pixel without enough
    chroma or more than :data:`HUE_TOLERANCE` degrees from every colour."""
    hue, chroma = hue_and_chroma(image)
    distance = np.abs((hue[..., None] - _HUE_ARR + 180.0) % 360.0 - 180.0)
    nearest = distance.argmin(-1)
    ok = (chroma >= MIN_CHROMA) & (np.take_along_axis(distance, nearest[..., None], -1)[..., 0] <= HUE_TOLERANCE)
    return np.where(ok, nearest, -1)


@lru_cache(maxsize=256)
def _template(shape: str, n: int) -> np.ndarray:
    return shape_mask(shape, n)


def _square_crop(mask: np.ndarray) -> np.ndarray:
    """``mask`` resampled (nearest neighbour) to a square of its mean side."""
    h, w = mask.shape
    n = round((h + w) / 2)
    if (h, w) == (n, n):
        return mask
    rows = np.minimum((np.arange(n) + 0.5) * h / n, h - 1).astype(int)
    cols = np.minimum((np.arange(n) + 0.5) * w / n, w - 1).astype(int)
    return mask[rows][:, cols]


def _iou(mask: np.ndarray, shape: str) -> float:
    t = _template(shape, mask.shape[0])
    return float((mask & t).sum() / (mask | t).sum())


def best_fit(mask: np.ndarray) -> tuple[str | None, float]:
    """The shape template that best fits a cropped component ``mask`` (tight bounding box) and its IoU, or
    ``(None, 0.0)`` when the crop cannot be one of the shapes (too small, too elongated)."""
    h, w = mask.shape
    if min(h, w) < MIN_SIDE or max(h, w) > MAX_ASPECT * min(h, w):
        return None, 0.0
    square = _square_crop(mask)
    return max(((s, _iou(square, s)) for s in SHAPES), key=lambda fit: fit[1])


def shape_of(mask: np.ndarray) -> str | None:
    """The shape a cropped component ``mask`` (tight bounding box) is by its fill, its top-to-bottom mass and its
    corners, or ``None`` when it is none of the three.

    A square fills its box and covers all four corners; a circle fills about three quarters, symmetric top to
    bottom, and no corner; the world's triangle (apex up) fills about half, a third of its mass in the top half,
    the bottom corners and neither top corner. A dome (a half-disc on a rectangle) covers the bottom corners but
    not the top ones and fills too much for a triangle: it is none of them."""
    h, w = mask.shape
    if min(h, w) < MIN_SIDE or max(h, w) > MAX_ASPECT * min(h, w):
        return None
    fill = float(mask.mean())
    top, bottom = float(mask[: h // 2].sum()), float(mask[(h + 1) // 2 :].sum())
    balance = (top + 1.0) / (bottom + 1.0)
    k = max(1, round(min(h, w) / 4))
    corners = [float(c.mean()) for c in (mask[:k, :k], mask[:k, -k:], mask[-k:, :k], mask[-k:, -k:])]
    top_corners, bottom_corners = max(corners[:2]), min(corners[2:])
    if fill >= 0.88 and min(corners) >= 0.5 and 0.8 <= balance <= 1.25:
        return "square"
    if 0.6 <= fill <= 0.9 and sum(corners) <= 2.0 and max(corners) <= 0.75 and 0.75 <= balance <= 1.33:
        return "circle"
    if 0.4 <= fill <= 0.82 and balance <= 0.65 and top_corners <= 0.25 and bottom_corners >= 0.5:
        return "triangle"
    return None


def _pieces(mask: np.ndarray, side: int) -> list[tuple[slice, slice]]:
    """Boxes of ``mask`` (one component) cut into object-sized pieces: a box longer than :data:`MAX_ASPECT`
    times ``side`` holds ``round(length / side)`` objects along its longer axis, and is cut at the line with the
    fewest pixels within two of each boundary between them (the nearest such line on a tie), the line itself
    going to neither part (it is the bridge); each part is cut again across the other axis, so objects bridged
    by blur come apart."""
    ys, xs = np.nonzero(mask)
    if ys.size == 0:
        return []
    y0, y1, x0, x1 = int(ys.min()), int(ys.max()) + 1, int(xs.min()), int(xs.max()) + 1
    h, w = y1 - y0, x1 - x0
    axis = 0 if h >= w else 1
    longest = max(h, w)
    count = round(longest / side)
    if longest <= MAX_ASPECT * side or count < 2:
        return [(slice(y0, y1), slice(x0, x1))]
    profile = mask[y0:y1, x0:x1].sum(axis=1 - axis)
    cuts = []
    for i in range(1, count):
        expected = round(i * longest / count)
        window = [c for c in range(expected - 2, expected + 3) if MIN_SIDE <= c <= longest - MIN_SIDE]
        if window:
            cuts.append(min(window, key=lambda c: (profile[c], abs(c - expected))))
    if not cuts:  # too small to leave each part MIN_SIDE pixels (a canvas under the world's 32 px)
        return [(slice(y0, y1), slice(x0, x1))]
    out: list[tuple[slice, slice]] = []
    for start, stop in zip([0, *(c + 1 for c in cuts)], [*cuts, longest], strict=True):  # the cut lines dropped
        part = np.zeros_like(mask)
        if axis == 0:
            part[y0 + start : y0 + stop] = mask[y0 + start : y0 + stop]
        else:
            part[:, x0 + start : x0 + stop] = mask[:, x0 + start : x0 + stop]
        out += _pieces(part, side)
    return out


def _objects(component: np.ndarray, chroma: np.ndarray, side: int) -> list[np.ndarray]:
    """The object masks in one colour component: its pixels at half its peak chroma or more (its 90th
    percentile; the edge of a blurred object, as a half-maximum locates a blurred step, without the halo blur
    leaves around it), each connected part cut into object-sized pieces (:func:`_pieces`)."""
    peak = float(np.percentile(chroma[component], 90))
    core = component & (chroma >= 0.5 * peak)
    parts, n = ndimage.label(core, structure=_STRUCT8)
    out = []
    for k in range(1, n + 1):
        part = parts == k
        for ys, xs in _pieces(part, side):
            piece = np.zeros_like(part)
            piece[ys, xs] = part[ys, xs]
            if piece.any():
                out.append(piece)
    return out


def detect(image: np.ndarray, min_area: int = MIN_AREA, min_iou: float = MIN_IOU) -> list[Detection]:
    """Objects in a uint8 ``(H, W, 3)`` image, best template fit first (ties top-to-bottom, left-to-right).

    ``min_iou`` below :data:`MIN_IOU` makes a looser detector that names shapes by template IoU alone and
    accepts rough ones (reward shaping; GenEval's verdicts use the default).

    ``label`` is the shape, ``color`` the palette colour, ``box`` ``(x0, y0, x1, y1)`` with exclusive ends."""
    if image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"expected (H, W, 3) image, got {image.shape}")
    labels = color_labels(image)
    _, chroma = hue_and_chroma(image)
    side = max(MIN_SIDE, round(OBJECT_SIZE * image.shape[1]))
    shaping = min_iou < MIN_IOU
    found: list[tuple[float, Detection]] = []
    for ci, color in enumerate(COLORS):
        comp, n = ndimage.label(labels == ci, structure=_STRUCT8)
        for k in range(1, n + 1):
            for piece in _objects(comp == k, chroma, side):
                ys, xs = ndimage.find_objects(piece.astype(int))[0]
                mask = piece[ys, xs]
                if int(mask.sum()) < min_area:
                    continue
                best, iou = best_fit(mask)
                shape = best if shaping else shape_of(mask)
                if shape is None:
                    continue
                iou = iou if shaping else _iou(_square_crop(mask), shape)
                if iou < min_iou:
                    continue
                box = (float(xs.start), float(ys.start), float(xs.stop), float(ys.stop))
                found.append((iou, Detection(label=shape, box=box, score=1.0, color=color)))
    found.sort(key=lambda fd: (-round(fd[0], 6), fd[1].box[1], fd[1].box[0]))
    return [d for _, d in found]


class WorldDetector:
    """The embedded world's detector (every detection has its colour and confidence 1).

    Args:
        min_iou: template IoU a component needs to be an object; below the default (:data:`MIN_IOU`) a looser
            detector for reward shaping.
    """

    def __init__(self, min_iou: float | None = None):
        self.min_iou = MIN_IOU if min_iou is None else float(min_iou)
        if not 0 < self.min_iou <= 1:
            raise ValueError(f"world detector: min_iou must be in (0, 1], got {min_iou!r}")

    @classmethod
    def vocabulary(cls) -> Vocabulary:
        """The world's shapes and palette colours."""
        what = f"the world detector (classes {list(SHAPES)}, colours {list(COLORS)})"
        return Vocabulary(what, frozenset(SHAPES), frozenset(COLORS))

    def detect(self, images: np.ndarray, metadata: Sequence[Any]) -> list[list[Detection]]:
        return [detect(image, min_iou=self.min_iou) for image in images]
