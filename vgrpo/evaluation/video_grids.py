"""Grids of an evaluation's videos (a video family's samples, :mod:`vgrpo.models.wan`): a still PNG with each video's
frames in a row (:func:`video_strip_image`), and an animated GIF whose frame ``t`` is the grid of every video's frame
``t`` (:func:`write_video_gif`). PIL only, like the image grids (:mod:`vgrpo.evaluation.grids`), whose framing,
scaling and captions both reuse."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from vgrpo.evaluation.grids import grid_image, write_png
from vgrpo.rewards.video import check_videos

__all__ = ["video_strip_image", "write_video_gif", "write_video_strip"]


def video_strip_image(
    videos: np.ndarray,
    scale: int = 4,
    *,
    captions: Sequence[str] | None = None,
    credited: Sequence[bool | None] | None = None,
) -> np.ndarray:
    """``videos`` (``uint8 (N, T, H, W, 3)``) as one image: video ``i``'s ``T`` frames in row ``i``, each framed and
    scaled as :func:`vgrpo.evaluation.grids.grid_image` frames images; ``captions`` one per video, ``credited`` one
    per video (its colour frames every frame of the row)."""
    arr = check_videos(videos)
    n, frames = arr.shape[:2]
    marks = None if credited is None else [c for c in credited for _ in range(frames)]
    if credited is not None and len(credited) != n:
        raise ValueError(f"{len(credited)} credit marks for {n} videos")
    return grid_image(arr.reshape(n * frames, *arr.shape[2:]), frames, scale, captions=captions, credited=marks)


def write_video_strip(
    path: str | Path,
    videos: np.ndarray,
    scale: int = 4,
    *,
    captions: Sequence[str] | None = None,
    credited: Sequence[bool | None] | None = None,
) -> None:
    """:func:`video_strip_image` as a PNG, written atomically."""
    write_png(path, video_strip_image(videos, scale, captions=captions, credited=credited))


def write_video_gif(path: str | Path, videos: np.ndarray, cols: int, scale: int = 4, *, frame_ms: int = 125) -> None:
    """An animated GIF, written atomically: its frame ``t`` tiles every video's frame ``t``, ``cols`` videos a row
    (:func:`vgrpo.evaluation.grids.grid_image`), shown ``frame_ms`` milliseconds each, looping."""
    arr = check_videos(videos)
    pictures = [Image.fromarray(grid_image(arr[:, t], cols, scale)) for t in range(arr.shape[1])]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".gif")
    os.close(fd)
    try:
        pictures[0].save(
            tmp, format="GIF", save_all=True, append_images=pictures[1:], duration=frame_ms, loop=0, optimize=False
        )
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
