"""Image grids of an evaluation: a row per prompt, a caption under it, each frame coloured by whether the
verifiable reward credits the image."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

__all__ = ["CAPTION_HEIGHT", "FRAME_COLORS", "grid_image", "grid_of", "side_by_side", "write_grid", "write_png"]


FRAME_COLORS: dict[bool | None, tuple[int, int, int]] = {True: (40, 200, 60), False: (200, 40, 40), None: (0, 0, 0)}
"""Frame of a grid image: credited by the verifiable reward (green), not credited (red), not verifiable (black)."""
CAPTION_HEIGHT = 14
"""Pixels of the caption strip under each grid row (PIL's built-in bitmap font, about 11 px high)."""


def grid_image(
    images: np.ndarray,
    cols: int,
    scale: int = 4,
    *,
    captions: Sequence[str] | None = None,
    credited: Sequence[bool | None] | None = None,
) -> np.ndarray:
    """``images`` tiled ``cols`` per row, each in a 1-pixel frame, nearest-neighbour upscaled ``scale`` times:
    ``uint8 (rows * ((H + 2) * scale + c), cols * (W + 2) * scale, 3)`` with ``c`` = :data:`CAPTION_HEIGHT`
    when ``captions`` (one per row, written under it) are given, else 0.

    ``credited`` (one per image) colours each frame by :data:`FRAME_COLORS`.
    """
    n, h, w, _ = images.shape
    rows = -(-n // cols)
    if captions is not None and len(captions) != rows:
        raise ValueError(f"{len(captions)} captions for {rows} grid rows")
    if credited is not None and len(credited) != n:
        raise ValueError(f"{len(credited)} credit marks for {n} images")
    tiles = np.zeros((rows * (h + 2), cols * (w + 2), 3), np.uint8)
    for k, image in enumerate(images):
        r, c = divmod(k, cols)
        y, x = r * (h + 2), c * (w + 2)
        tiles[y : y + h + 2, x : x + w + 2] = FRAME_COLORS[None if credited is None else credited[k]]
        tiles[y + 1 : y + 1 + h, x + 1 : x + 1 + w] = image
    tiles = tiles.repeat(scale, 0).repeat(scale, 1)
    if captions is None:
        return tiles

    row_h = (h + 2) * scale
    out = Image.new("RGB", (tiles.shape[1], rows * (row_h + CAPTION_HEIGHT)), (32, 32, 32))
    draw = ImageDraw.Draw(out)
    for r, caption in enumerate(captions):
        top = r * (row_h + CAPTION_HEIGHT)
        out.paste(Image.fromarray(tiles[r * row_h : (r + 1) * row_h]), (0, top))
        draw.text((3, top + row_h + 1), caption, fill=(235, 235, 235))
    return np.asarray(out)


def write_grid(
    path: str | Path,
    images: np.ndarray,
    cols: int,
    scale: int = 4,
    *,
    captions: Sequence[str] | None = None,
    credited: Sequence[bool | None] | None = None,
) -> None:
    """:func:`grid_image` as a PNG, written atomically."""
    write_png(path, grid_image(images, cols, scale, captions=captions, credited=credited))


def write_png(path: str | Path, image: np.ndarray) -> None:
    """A uint8 ``(H, W, 3)`` image as a PNG, written atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".png")
    os.close(fd)
    try:
        Image.fromarray(image).save(tmp, format="PNG")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def side_by_side(grids: Sequence[np.ndarray], titles: Sequence[str], gap: int = 8) -> np.ndarray:
    """Grids (uint8 ``(H, W, 3)``, e.g. the base's and a trained model's on the same prompts and seeds) next to
    each other, ``gap`` pixels apart, each under its title."""
    if len(grids) != len(titles):
        raise ValueError(f"{len(titles)} titles for {len(grids)} grids")
    height = max(g.shape[0] for g in grids) + CAPTION_HEIGHT
    width = sum(g.shape[1] for g in grids) + gap * (len(grids) - 1)
    out = Image.new("RGB", (width, height), (32, 32, 32))
    draw = ImageDraw.Draw(out)
    x = 0
    for grid, title in zip(grids, titles, strict=True):
        draw.text((x + 3, 1), title, fill=(235, 235, 235))
        out.paste(Image.fromarray(grid), (x, CAPTION_HEIGHT))
        x += grid.shape[1] + gap
    return np.asarray(out)


def grid_of(table: Mapping[str, Any], images: np.ndarray, prompts: int) -> dict[str, Any]:
    """Keyword arguments of :func:`grid_image` for the first ``prompts`` prompts of an evaluation ``table`` and
    its ``images``: a row per prompt, its caption, and the credit marks of ``per_prompt``. Videos (uint8
    ``(N, T, H, W, 3)``, a video family's samples) lay each video's frames side by side, its mark on every frame."""
    group, detail = int(table["group_size"]), table["per_prompt"]
    rows = min(prompts, len(detail["prompt"]))
    shown = images[: rows * group]
    frames = shown.shape[1] if shown.ndim == 5 else 1
    return {
        "images": shown.reshape(-1, *shown.shape[-3:]),
        "cols": group * frames,
        "captions": detail["prompt"][:rows],
        "credited": [mark for marks in detail["credited"][:rows] for mark in marks for _ in range(frames)],
    }
