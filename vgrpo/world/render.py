"""Deterministic rasteriser for :class:`~vgrpo.world.scene.Scene`: flat shapes on a plain background plus
short text in a built-in 5x7 bitmap font (the OCR target). Pure numpy, no anti-aliasing, so the same scene
always gives the same bytes and :mod:`vgrpo.world.detect` can verify it exactly."""

from __future__ import annotations

import numpy as np

from vgrpo.world.scene import BACKGROUND, PALETTE, TEXT_BAND, TEXT_COLOR, ObjectSpec, Scene

# Upper-case 5x7 dot-matrix glyphs (the classic HD44780 LCD shapes): a 3x5 font was too crude for PP-OCR,
# which read "yes" as "TES" and "open" as "DFEn"; these read back exactly once upscaled.
_GLYPH_ROWS: dict[str, str] = {
    "a": ".###. #...# #...# ##### #...# #...# #...#",
    "b": "####. #...# #...# ####. #...# #...# ####.",
    "c": ".###. #...# #.... #.... #.... #...# .###.",
    "d": "###.. #..#. #...# #...# #...# #..#. ###..",
    "e": "##### #.... #.... ####. #.... #.... #####",
    "f": "##### #.... #.... ####. #.... #.... #....",
    "g": ".###. #...# #.... #.### #...# #...# .####",
    "h": "#...# #...# #...# ##### #...# #...# #...#",
    "i": ".###. ..#.. ..#.. ..#.. ..#.. ..#.. .###.",
    "j": "..### ...#. ...#. ...#. ...#. #..#. .##..",
    "k": "#...# #..#. #.#.. ##... #.#.. #..#. #...#",
    "l": "#.... #.... #.... #.... #.... #.... #####",
    "m": "#...# ##.## #.#.# #.#.# #...# #...# #...#",
    "n": "#...# ##..# ##..# #.#.# #..## #..## #...#",
    "o": ".###. #...# #...# #...# #...# #...# .###.",
    "p": "####. #...# #...# ####. #.... #.... #....",
    "q": ".###. #...# #...# #...# #.#.# #..#. .##.#",
    "r": "####. #...# #...# ####. #.#.. #..#. #...#",
    "s": ".#### #.... #.... .###. ....# ....# ####.",
    "t": "##### ..#.. ..#.. ..#.. ..#.. ..#.. ..#..",
    "u": "#...# #...# #...# #...# #...# #...# .###.",
    "v": "#...# #...# #...# #...# #...# .#.#. ..#..",
    "w": "#...# #...# #...# #.#.# #.#.# #.#.# .#.#.",
    "x": "#...# #...# .#.#. ..#.. .#.#. #...# #...#",
    "y": "#...# #...# .#.#. ..#.. ..#.. ..#.. ..#..",
    "z": "##### ....# ...#. ..#.. .#... #.... #####",
    "0": ".###. #...# #..## #.#.# ##..# #...# .###.",
    "1": "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###.",
    "2": ".###. #...# ....# ...#. ..#.. .#... #####",
    "3": "##### ...#. ..#.. ...#. ....# #...# .###.",
    "4": "...#. ..##. .#.#. #..#. ##### ...#. ...#.",
    "5": "##### #.... ####. ....# ....# #...# .###.",
    "6": "..##. .#... #.... ####. #...# #...# .###.",
    "7": "##### ....# ...#. ..#.. .#... .#... .#...",
    "8": ".###. #...# #...# .###. #...# #...# .###.",
    "9": ".###. #...# #...# .#### ....# ...#. .##..",
    " ": "..... ..... ..... ..... ..... ..... .....",
}

GLYPHS: dict[str, np.ndarray] = {
    ch: np.array([[c == "#" for c in row] for row in rows.split()], dtype=bool) for ch, rows in _GLYPH_ROWS.items()
}
"""5x7 boolean glyphs for ``a-z`` (drawn upper-case), ``0-9`` and space; text is lower-cased before lookup."""
GLYPH_W, GLYPH_H, GLYPH_GAP = 5, 7, 1
FONT_CHARS = frozenset(GLYPHS)


def max_text_chars(size: int) -> int:
    """How many glyphs fit on one line of a ``size``-wide canvas (one pixel margin each side)."""
    return (size - 2 + GLYPH_GAP) // (GLYPH_W + GLYPH_GAP)


def shape_mask(shape: str, n: int) -> np.ndarray:
    """Boolean ``n x n`` raster of ``shape`` filling its bounding box (every shape touches all four sides)."""
    idx = np.arange(n, dtype=np.float64)
    c = (n - 1) / 2
    yy, xx = np.meshgrid(idx, idx, indexing="ij")
    r2 = (yy - c) ** 2 + (xx - c) ** 2
    if shape == "square":
        return np.ones((n, n), dtype=bool)
    if shape == "circle":
        return r2 <= (n / 2) ** 2 - 0.25 * n / 7
    if shape == "triangle":
        half = c * yy / (n - 1) + (0.5 if n % 2 == 0 else 0.0)
        return np.abs(xx - c) <= half + 1e-9
    raise ValueError(f"unknown shape {shape!r}")


def pixel_box(obj: ObjectSpec, size: int) -> tuple[int, int, int]:
    """Integer ``(x0, y0, side)`` of ``obj`` on a ``size`` canvas, clipped to stay inside it."""
    side = max(5, round(obj.size * size))
    x0 = min(max(round(obj.x * size - side / 2), 0), size - side)
    y0 = min(max(round(obj.y * size - side / 2), 0), size - side)
    return x0, y0, side


def draw_text(img: np.ndarray, text: str, color: tuple[int, int, int] = TEXT_COLOR) -> None:
    """Draw ``text`` (lower-cased; unknown characters become spaces; clipped to one line) centred in the
    bottom text band of ``img`` in place."""
    h, w = img.shape[:2]
    chars = [ch if ch in GLYPHS else " " for ch in text.lower()][: max_text_chars(w)]
    if not chars:
        return
    width = len(chars) * (GLYPH_W + GLYPH_GAP) - GLYPH_GAP
    x = (w - width) // 2
    band_top = h - round(TEXT_BAND * h)
    # Canvases below 32 px have a band shorter than a glyph: the glyphs are cut at the bottom edge.
    y = max(0, band_top + (h - band_top - GLYPH_H) // 2)
    rows = min(GLYPH_H, h - y)
    for ch in chars:
        img[y : y + rows, x : x + GLYPH_W][GLYPHS[ch][:rows]] = color
        x += GLYPH_W + GLYPH_GAP


def render(scene: Scene, size: int = 32) -> np.ndarray:
    """Rasterise ``scene`` to a ``(size, size, 3)`` uint8 image on :data:`BACKGROUND`."""
    img = np.empty((size, size, 3), dtype=np.uint8)
    img[:] = BACKGROUND
    for obj in scene.objects:
        x0, y0, side = pixel_box(obj, size)
        img[y0 : y0 + side, x0 : x0 + side][shape_mask(obj.shape, side)] = PALETTE[obj.color]
    if scene.text:
        draw_text(img, scene.text)
    return img
