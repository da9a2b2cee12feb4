"""OCR reward of Flow-GRPO (algorithm.md §6) with a PP-OCR engine that runs offline on the CPU.

The score: the target is the text between the first pair of double quotes in the prompt; recognised text
and target are lower-cased with spaces removed; the distance is 0 when the target is a substring of the
recognised text, else their Levenshtein distance capped at the target length; reward ``1 - d / len(target)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["RapidOCRReader", "levenshtein", "ocr_score", "ocr_target"]


def ocr_target(prompt: str) -> str:
    """The quoted text of an OCR prompt (Flow-GRPO: ``prompt.split('"')[1]``).

    Raises:
        ValueError: when the prompt has no double-quoted text.
    """
    parts = prompt.split('"')
    if len(parts) < 3:
        raise ValueError(f"OCR prompt has no double-quoted target text: {prompt!r}")
    return parts[1]


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions all cost 1)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def ocr_score(recognised: str, target: str) -> float:
    """Flow-GRPO's OCR reward for one image (see the module docstring)."""
    rec = recognised.replace(" ", "").lower()
    tgt = target.replace(" ", "").lower()
    if not tgt:
        raise ValueError("OCR target text is empty")
    dist = 0 if tgt in rec else min(levenshtein(rec, tgt), len(tgt))
    return 1.0 - dist / len(tgt)


class RapidOCRReader:
    """PP-OCR (the detector and recogniser family Flow-GRPO uses through PaddleOCR) via ``rapidocr-onnxruntime``,
    whose wheel carries the ONNX models.

    Images smaller than ``min_side`` are upscaled with bicubic interpolation first: PP-OCR is trained on
    anti-aliased text of natural sizes, and reads the embedded world's 7-pixel glyphs only once they are
    smooth and large (nearest-neighbour upscaling read "no" as "H0").
    """

    def __init__(self, min_side: int = 128, **engine_kwargs: Any):
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("the OCR reward needs `pip install rapidocr-onnxruntime`") from exc
        self.engine = RapidOCR(**engine_kwargs)
        self.min_side = min_side

    def _prepare(self, image: np.ndarray) -> np.ndarray:
        import cv2

        side = min(image.shape[:2])
        if side >= self.min_side:
            return image
        factor = int(np.ceil(self.min_side / side))
        return cv2.resize(image, None, fx=factor, fy=factor, interpolation=cv2.INTER_CUBIC)

    def read(self, images: Sequence[np.ndarray] | np.ndarray) -> list[str]:
        """Recognised text (detected lines concatenated in reading order) of each uint8 ``(H, W, 3)`` RGB image."""
        out = []
        for image in images:
            # RapidOCR takes OpenCV's BGR order.
            result, _ = self.engine(np.ascontiguousarray(self._prepare(np.asarray(image))[..., ::-1]))
            out.append("".join(str(line[1]) for line in result) if result else "")
        return out
