"""Image files a command reads (an editing prompt row's source image, the samples an edit set is built from),
checked before any compute: each one opens as an image and its whole stream reads back (PIL's ``verify``: a
truncated or corrupt file is named now, not at the rollout that first decodes it), and has the size expected of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["MAX_LISTED", "image_problem", "image_size", "summarised"]

MAX_LISTED = 10
"""Bad image files named one by one in a message; the rest are counted (a moved folder fails every one of them)."""


def image_size(path: Path) -> tuple[int, int] | None:
    """``(width, height)`` of the image at ``path`` from its header; None when it does not open."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            return image.size
    except Exception:  # PIL raises its own types per format (UnidentifiedImageError, DecompressionBombError, ...)
        return None


def image_problem(path: Path, size: tuple[int, int] | None = None) -> str | None:
    """What is wrong with the image file at ``path``: missing, not an image PIL reads (or over its decompression-bomb
    limit), truncated or corrupt, or not ``size`` (``(width, height)``) when given; None when it reads."""
    from PIL import Image

    if not path.is_file():
        return "not found"
    try:
        with Image.open(path) as image:
            found = image.size
            image.verify()  # reads every chunk and its checksum without decoding the pixels
    except Exception as exc:  # each format's reader raises its own type (OSError, SyntaxError, struct.error, ...)
        return f"is not an image that opens ({type(exc).__name__}: {exc})"
    if min(found) < 1:
        return f"is an empty image ({found[0]}x{found[1]} pixels)"
    if size is not None and found != size:
        return f"is {found[0]}x{found[1]} pixels, expected {size[0]}x{size[1]}"
    return None


def summarised(problems: Sequence[str], what: str) -> list[str]:
    """``problems`` as message lines: the first :data:`MAX_LISTED`, then how many more ``what`` there are."""
    more = len(problems) - MAX_LISTED
    return [*problems[:MAX_LISTED], *([f"... and {more} more {what}"] if more > 0 else [])]
