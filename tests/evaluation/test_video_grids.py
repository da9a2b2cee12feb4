"""Video grids (vgrpo/evaluation/video_grids.py): a still strip with each video's frames in a row, and an animated
GIF whose frame t tiles every video's frame t."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from vgrpo.evaluation.grids import FRAME_COLORS, grid_image
from vgrpo.evaluation.video_grids import video_strip_image, write_video_gif, write_video_strip


def _videos() -> np.ndarray:
    videos = np.zeros((2, 3, 4, 4, 3), np.uint8)
    for i in range(2):
        for t in range(3):
            videos[i, t] = 40 * (3 * i + t) + 10  # each frame its own grey
    return videos


def test_the_strip_puts_each_videos_frames_in_a_row(tmp_path: Path) -> None:
    videos = _videos()
    strip = video_strip_image(videos, scale=1, credited=[True, False])
    assert strip.shape == (2 * 6, 3 * 6, 3)
    for i in range(2):
        for t in range(3):
            np.testing.assert_array_equal(strip[i * 6 + 1 : i * 6 + 5, t * 6 + 1 : t * 6 + 5], videos[i, t])
            assert tuple(strip[i * 6, t * 6]) == FRAME_COLORS[i == 0]  # the video's mark frames each of its frames
    write_video_strip(tmp_path / "strip.png", videos, scale=2, captions=["a cat", "waves"])
    with Image.open(tmp_path / "strip.png") as png:
        assert png.size == (3 * 6 * 2, 2 * (6 * 2 + 14))


def test_the_gif_animates_the_grid_of_the_videos_frames(tmp_path: Path) -> None:
    videos = _videos()
    write_video_gif(tmp_path / "videos.gif", videos, cols=2, scale=1, frame_ms=100)
    with Image.open(tmp_path / "videos.gif") as gif:
        assert gif.n_frames == 3 and gif.size == (2 * 6, 6) and gif.info["loop"] == 0
        for t in range(3):
            gif.seek(t)
            # Greys are exact in a GIF's palette.
            np.testing.assert_array_equal(np.asarray(gif.convert("RGB")), grid_image(videos[:, t], 2, 1))


def test_an_evaluations_grid_lays_each_videos_frames_side_by_side() -> None:
    from vgrpo.evaluation.grids import grid_of

    videos = np.concatenate([_videos(), _videos()])  # 2 prompts x group 2
    table = {"group_size": 2, "per_prompt": {"prompt": ["a", "b"], "credited": [[True, False], [None, True]]}}
    kwargs = grid_of(table, videos, prompts=1)
    assert kwargs["images"].shape == (2 * 3, 4, 4, 3) and kwargs["cols"] == 2 * 3
    assert kwargs["credited"] == [True] * 3 + [False] * 3 and kwargs["captions"] == ["a"]
    np.testing.assert_array_equal(kwargs["images"][4], videos[1, 1])
    assert grid_image(**kwargs).shape == (6 * 4 + 14, 6 * 6 * 4, 3)  # one row of six 4x-scaled framed frames
