"""The OCR reward as in Flow-GRPO (Liu et al. 2025), with a PP-OCR engine that runs offline on the CPU.

The score: the target is the text between the first pair of double quotes in the prompt; recognised text
and target are lower-cased with spaces removed; the distance is 0 when the target is a substring of the
recognised text, else their Levenshtein distance capped at the target length; reward ``1 - d / len(target)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vgrpo.rewards.base import Metadata, Reward, RewardOutput

__all__ = [
    "OCRReward",
    "PaddleOCRReader",
    "RapidOCRLineReader",
    "RapidOCRReader",
    "levenshtein",
    "ocr_score",
    "ocr_target",
]


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
    anti-aliased text of natural sizes, and reads small glyphs (the embedded world's are 7 pixels) only once
    they are smooth and large.
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


class RapidOCRLineReader:
    """PP-OCR's recogniser alone (no text detector) on one known text line per image, via ``rapidocr-onnxruntime``.

    Where an image's text line is known -- a fixed band of the canvas, as in a procedural world -- the detector
    is the expensive half of PP-OCR and adds nothing: the crop ``line_box`` (canvas fractions ``x0, y0, x1,
    y1``) is upscaled with bicubic interpolation to ``height`` pixels (the recogniser's input height is 48) and
    recognised in batches of ``batch_size``, each line right-padded to ``width`` pixels (PP-OCR's 320 by
    default; a narrower pad trades accuracy for speed, docs/rewards.md). Text outside the box is not read.
    """

    def __init__(
        self,
        line_box: Sequence[float],
        height: int = 48,
        width: int | None = None,
        batch_size: int = 64,
        **engine_kwargs: Any,
    ):
        if len(line_box) != 4 or not 0 <= line_box[0] < line_box[2] <= 1 or not 0 <= line_box[1] < line_box[3] <= 1:
            raise ValueError(f"line_box must be fractions x0 < x1, y0 < y1 in [0, 1], got {list(line_box)}")
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("the OCR reward needs `pip install rapidocr-onnxruntime`") from exc
        self.recogniser = RapidOCR(**engine_kwargs).text_rec
        self.recogniser.rec_batch_num = batch_size
        if width is not None:
            self.recogniser.rec_image_shape = [3, height, width]
        self.line_box = tuple(float(v) for v in line_box)
        self.height = height

    def crop(self, image: np.ndarray) -> np.ndarray:
        """The upscaled ``line_box`` crop of one uint8 ``(H, W, 3)`` RGB image, in OpenCV's BGR order."""
        import cv2

        h, w = image.shape[:2]
        x0, y0, x1, y1 = self.line_box
        line = image[round(y0 * h) : max(round(y1 * h), round(y0 * h) + 1), round(x0 * w) : max(round(x1 * w), 1)]
        factor = self.height / line.shape[0]
        size = (max(1, round(line.shape[1] * factor)), self.height)
        return np.ascontiguousarray(cv2.resize(line, size, interpolation=cv2.INTER_CUBIC)[..., ::-1])

    def read(self, images: Sequence[np.ndarray] | np.ndarray) -> list[str]:
        """Recognised text of each image's line."""
        if len(images) == 0:
            return []
        results, _ = self.recogniser([self.crop(np.asarray(image)) for image in images])
        return [str(text) for text, *_ in results]


class OCRReward(Reward):
    """Flow-GRPO's OCR reward (:func:`ocr_score`) with a PP-OCR engine: ``rapidocr`` (the default, ONNX models
    inside the wheel) or ``paddleocr`` when installed. The target is the prompt's quoted text; ``sub_scores``
    has ``exact`` (the whole target read: score 1).

    Args:
        engine: ``"rapidocr"`` or ``"paddleocr"``, or any object with ``read(images) -> list[str]``.
        min_side: images are upscaled (bicubic) to at least this side before reading (see :class:`RapidOCRReader`).
        engine_options: keyword options of the engine (RapidOCR's config keys, e.g. ``det_limit_side_len``; with
            ``line_box``, those of :class:`RapidOCRLineReader`, e.g. ``width``).
        line_box: read one known text line, the crop ``(x0, y0, x1, y1)`` in canvas fractions, with the
            recogniser alone (:class:`RapidOCRLineReader`, rapidocr only); ``None`` (the default, Flow-GRPO's
            setting) detects text lines anywhere in the image first.
    """

    name = "ocr"
    credit_sub_scores = ("exact",)

    def __init__(
        self,
        engine: Any = "rapidocr",
        min_side: int = 128,
        engine_options: dict[str, Any] | None = None,
        line_box: Sequence[float] | None = None,
    ):
        if line_box is not None and engine != "rapidocr":
            raise ValueError(f"OCR line_box reads with the rapidocr recogniser only, got engine {engine!r}")
        if line_box is not None:
            self.reader: Any = RapidOCRLineReader(line_box, **(engine_options or {}))
        elif engine == "rapidocr":
            self.reader = RapidOCRReader(min_side=min_side, **(engine_options or {}))
        elif engine == "paddleocr":
            self.reader = PaddleOCRReader(min_side=min_side, **(engine_options or {}))
        elif isinstance(engine, str):
            raise ValueError(f"OCR engine must be 'rapidocr' or 'paddleocr', got {engine!r}")
        else:
            self.reader = engine

    def applies_to(self, prompt: str, metadata: Metadata | None) -> bool:
        return prompt.count('"') >= 2

    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        targets = [ocr_target(p) for p in prompts]
        texts = self.reader.read(images)
        scores = np.array([ocr_score(text, target) for text, target in zip(texts, targets, strict=True)])
        return RewardOutput(scores=scores, sub_scores={"exact": (scores == 1.0).astype(np.float64)})


class PaddleOCRReader(RapidOCRReader):
    """PaddleOCR 3 (what Flow-GRPO uses), when ``paddleocr`` and ``paddlepaddle`` are installed and its models
    are available locally (``engine_kwargs`` such as ``text_recognition_model_dir``); the default is RapidOCR,
    and the tests run RapidOCR only (docs/rewards.md)."""

    def __init__(self, min_side: int = 128, **engine_kwargs: Any):  # pragma: no cover - optional engine
        try:
            from paddleocr import PaddleOCR
        except ImportError as exc:
            raise ImportError("the paddleocr engine needs `pip install paddleocr paddlepaddle`") from exc
        opts = {"use_doc_orientation_classify": False, "use_doc_unwarping": False, "use_textline_orientation": False}
        self.engine = PaddleOCR(**(opts | engine_kwargs))
        self.min_side = min_side

    def read(self, images: Sequence[np.ndarray] | np.ndarray) -> list[str]:  # pragma: no cover - optional engine
        out = []
        for image in images:
            results = self.engine.predict(np.ascontiguousarray(self._prepare(np.asarray(image))[..., ::-1]))
            out.append("".join(str(t) for res in results for t in res["rec_texts"]))
        return out
