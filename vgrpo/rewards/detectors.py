"""Object detectors that feed :mod:`vgrpo.rewards.geneval`: one interface, three sources of detections.

* ``world`` -- the embedded world's exact detector (:class:`vgrpo.world.detect.WorldDetector`).
* :class:`Mask2FormerDetector` -- GenEval's detector for real images: Mask2Former (Swin-S, COCO) through
  ``mmdet``, and CLIP ViT-L/14 zero-shot colour on the masked crop (:class:`ClipColorClassifier`), loaded
  from local paths. ``mmdet`` is an optional extra (``pip install "vgrpo[geneval]"`` on a GPU machine);
  :func:`parse_mmdet_result` (both mmdet 2 tuples and mmdet 3 ``DetDataSample``) is tested on recorded outputs
  (docs/rewards.md).
* :class:`RecordedDetector` -- detections saved earlier (JSONL keyed by the image's SHA-256), to re-score
  images offline or pin GenEval scoring in tests.

A named detector's class also names what it can see (its ``vocabulary()`` class method, read by
:func:`detector_vocabulary` before anything is loaded), so a prompt file's clauses are checked against the detector
that will score them.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

from vgrpo.rewards.base import Metadata
from vgrpo.rewards.clauses import Detection, Vocabulary
from vgrpo.rewards.preference import pooled_features

__all__ = [
    "GENEVAL_COLORS",
    "ClipColorClassifier",
    "Detector",
    "Mask2FormerDetector",
    "RecordedDetector",
    "build_detector",
    "colored_detections",
    "detector_vocabulary",
    "geneval_classnames",
    "image_sha256",
    "parse_mmdet_result",
]

GENEVAL_COLORS: tuple[str, ...] = (
    "red",
    "orange",
    "yellow",
    "green",
    "blue",
    "purple",
    "pink",
    "brown",
    "black",
    "white",
)
COLOR_TEMPLATES: tuple[str, ...] = (
    "a photo of a {c} {cls}",
    "a photo of a {c}-colored {cls}",
    "a photo of a {c} object",
)
"""GenEval's three zero-shot colour prompts, averaged per colour (clip_benchmark ``zero_shot_classifier``)."""
CROP_BACKGROUND = (153, 153, 153)
"""GenEval pastes the masked object onto ``#999`` before cropping its box."""


class Detector(Protocol):
    """``detect(images uint8 (N, H, W, 3), metadata (N,)) -> N lists of detections``. A detector class registered
    by name may also have a ``vocabulary()`` class method returning its :class:`vgrpo.rewards.clauses.Vocabulary`
    (:func:`detector_vocabulary`)."""

    def detect(self, images: np.ndarray, metadata: Sequence[Metadata]) -> list[list[Detection]]: ...


def geneval_classnames() -> list[str]:
    """GenEval's 80 COCO class names in the detector's label order (``object_names.txt``, MIT, shipped)."""
    text = resources.files("vgrpo.rewards").joinpath("data/geneval_object_names.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def image_sha256(image: np.ndarray) -> str:
    """Content key of one image: SHA-256 of its shape and bytes."""
    arr = np.ascontiguousarray(image)
    return hashlib.sha256(repr(arr.shape).encode() + arr.tobytes()).hexdigest()


class RecordedDetector:
    """Detections looked up by image content, from :meth:`from_jsonl` rows
    ``{"image_sha256": ..., "detections": [{"label", "box", "score", "color"}, ...]}``."""

    def __init__(self, records: Mapping[str, Sequence[Detection]]):
        self.records = {k: list(v) for k, v in records.items()}

    @classmethod
    def from_jsonl(cls, path: str | Path) -> RecordedDetector:
        records: dict[str, list[Detection]] = {}
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    dets = [
                        Detection(
                            label=str(d["label"]),
                            box=(float(d["box"][0]), float(d["box"][1]), float(d["box"][2]), float(d["box"][3])),
                            score=float(d.get("score", 1.0)),
                            color=d.get("color"),
                        )
                        for d in row["detections"]
                    ]
                    records[str(row["image_sha256"])] = dets
                except (KeyError, TypeError, IndexError, ValueError) as exc:
                    raise ValueError(f"{path}:{lineno}: not a recorded-detections row ({exc})") from exc
        return cls(records)

    @staticmethod
    def to_rows(images: np.ndarray, detections: Sequence[Sequence[Detection]]) -> list[dict[str, Any]]:
        """JSONL rows recording ``detections`` of ``images`` (the inverse of :meth:`from_jsonl`)."""
        return [
            {"image_sha256": image_sha256(img), "detections": [vars(d) | {"box": list(d.box)} for d in dets]}
            for img, dets in zip(images, detections, strict=True)
        ]

    def detect(self, images: np.ndarray, metadata: Sequence[Metadata]) -> list[list[Detection]]:
        out = []
        for i, image in enumerate(images):
            key = image_sha256(image)
            if key not in self.records:
                raise KeyError(f"no recorded detections for image {i} (sha256 {key[:12]}...)")
            out.append(list(self.records[key]))
        return out


def parse_mmdet_result(result: Any, classnames: Sequence[str]) -> list[tuple[Detection, np.ndarray | None]]:
    """Detections (and their masks) from one mmdet result: mmdet 2's ``(bbox_results, segm_results)`` with
    per-class ``(n, 5)`` arrays of ``x0, y0, x1, y1, score``, or mmdet 3's ``DetDataSample`` whose
    ``pred_instances`` has ``bboxes``, ``scores``, ``labels`` and ``masks``."""

    def numpy(x: Any) -> np.ndarray:
        return np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)

    def box(row: np.ndarray) -> tuple[float, float, float, float]:
        return (float(row[0]), float(row[1]), float(row[2]), float(row[3]))

    out: list[tuple[Detection, np.ndarray | None]] = []
    if hasattr(result, "pred_instances"):
        inst = result.pred_instances
        boxes, scores, labels = numpy(inst.bboxes), numpy(inst.scores), numpy(inst.labels)
        masks = numpy(inst.masks) if hasattr(inst, "masks") else None
        for k in range(len(scores)):
            det = Detection(label=classnames[int(labels[k])], box=box(boxes[k]), score=float(scores[k]))
            out.append((det, None if masks is None else masks[k].astype(bool)))
        return out
    bbox = result[0] if isinstance(result, tuple) else result
    segm = result[1] if isinstance(result, tuple) and len(result) > 1 else None
    if len(bbox) != len(classnames):
        raise ValueError(f"mmdet result has {len(bbox)} classes, expected {len(classnames)}")
    for c, rows in enumerate(bbox):
        for k, row in enumerate(numpy(rows)):
            det = Detection(label=classnames[c], box=box(row), score=float(row[4]))
            out.append((det, None if segm is None else np.asarray(segm[c][k]).astype(bool)))
    return out


class ClipColorClassifier:
    """GenEval's colour check: CLIP zero-shot over :data:`GENEVAL_COLORS` on the object's box crop after the
    pixels outside its mask are replaced by grey; class embeddings are the normalised mean of the three
    :data:`COLOR_TEMPLATES` embeddings (clip_benchmark); logits ``100 * cos``.

    ``path`` is a local transformers CLIP directory (GenEval uses OpenAI's ViT-L/14).
    """

    def __init__(self, path: str | Path, device: str | None = None):
        import torch
        from transformers import CLIPModel, CLIPProcessor

        if not Path(path).is_dir():
            raise FileNotFoundError(f"CLIP colour classifier: no model directory at {path}")
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model: Any = cast(Any, CLIPModel).from_pretrained(str(path), local_files_only=True, use_safetensors=True)
        self.model.to(self.device).eval()
        self.processor = CLIPProcessor.from_pretrained(str(path), local_files_only=True)
        self._classifiers: dict[str, Any] = {}

    def _classifier(self, classname: str) -> Any:
        import torch

        if classname not in self._classifiers:
            weights = []
            for color in GENEVAL_COLORS:
                texts = [t.format(c=color, cls=classname) for t in COLOR_TEMPLATES]
                tok = self.processor.tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
                with torch.no_grad():
                    emb = pooled_features(self.model.get_text_features(**tok.to(self.device)))
                emb = torch.nn.functional.normalize(emb, dim=-1).mean(0)
                weights.append(emb / emb.norm())
            self._classifiers[classname] = torch.stack(weights, dim=1)  # (D, colours)
        return self._classifiers[classname]

    @staticmethod
    def crop(image: np.ndarray, box: Sequence[float], mask: np.ndarray | None) -> np.ndarray:
        """The masked object on grey, cropped to ``box`` (GenEval's ``ImageCrops``)."""
        out = image if mask is None else np.where(mask[..., None], image, np.array(CROP_BACKGROUND, np.uint8))
        x0, y0, x1, y1 = (round(float(v)) for v in box[:4])
        return np.ascontiguousarray(out[max(y0, 0) : max(y1, y0 + 1), max(x0, 0) : max(x1, x0 + 1)])

    def classify(self, image: np.ndarray, objects: Sequence[tuple[Detection, np.ndarray | None]]) -> list[str]:
        """The colour name of each ``(detection, mask)`` in ``image``."""
        import torch

        if not objects:
            return []
        crops = [self.crop(image, det.box, mask) for det, mask in objects]
        pixels = self.processor.image_processor(images=crops, return_tensors="pt")["pixel_values"].to(self.device)
        colors = []
        with torch.no_grad():
            feats = torch.nn.functional.normalize(
                pooled_features(self.model.get_image_features(pixel_values=pixels)), dim=-1
            )
        for (det, _), feat in zip(objects, feats, strict=True):
            logits = 100.0 * feat @ self._classifier(det.label)
            colors.append(GENEVAL_COLORS[int(logits.argmax())])
        return colors


class Mask2FormerDetector:
    """GenEval's detector: an mmdet Mask2Former from a local config and checkpoint, with CLIP colours for the
    classes that a colour clause of the image's metadata names."""

    def __init__(
        self,
        config_path: str | Path,
        checkpoint_path: str | Path,
        clip_path: str | Path,
        device: str | None = None,
        min_score: float = 0.3,
    ):
        for what, p in (("mmdet config", config_path), ("Mask2Former checkpoint", checkpoint_path)):
            if not Path(p).is_file():
                raise FileNotFoundError(f"GenEval detector: no {what} at {p}")
        try:
            from mmdet.apis import init_detector
        except ImportError as exc:  # pragma: no cover - mmdet is an optional extra
            raise ImportError("the Mask2Former GenEval detector needs mmdet (and mmcv) installed") from exc
        import torch

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = init_detector(str(config_path), str(checkpoint_path), device=self.device)  # pragma: no cover
        self.colors = ClipColorClassifier(clip_path, self.device)  # pragma: no cover
        self.classnames = geneval_classnames()  # pragma: no cover
        self.min_score = min_score  # pragma: no cover

    @classmethod
    def vocabulary(cls) -> Vocabulary:
        """GenEval's 80 COCO classes and its colours."""
        what = "Mask2Former (GenEval's 80 COCO classes, vgrpo/rewards/data/geneval_object_names.txt, and its colours)"
        return Vocabulary(what, frozenset(geneval_classnames()), frozenset(GENEVAL_COLORS))

    def detect(self, images: np.ndarray, metadata: Sequence[Metadata]) -> list[list[Detection]]:  # pragma: no cover
        from mmdet.apis import inference_detector

        # mmdet reads arrays as BGR (GenEval passes file paths, loaded as BGR).
        results = inference_detector(self.model, [np.ascontiguousarray(img[..., ::-1]) for img in images])
        return [
            colored_detections(img, parse_mmdet_result(res, self.classnames), md, self.colors, self.min_score)
            for img, res, md in zip(images, results, metadata, strict=True)
        ]


def colored_detections(
    image: np.ndarray,
    found: Sequence[tuple[Detection, np.ndarray | None]],
    metadata: Metadata,
    classifier: ClipColorClassifier,
    min_score: float = 0.3,
) -> list[Detection]:
    """Detections above ``min_score`` (the lowest GenEval threshold, so nothing it keeps is lost), with CLIP
    colours for the classes that a colour clause of ``metadata`` names."""
    wanted = {req["class"] for req in metadata.get("include", []) if "color" in req}
    kept = [(d, m) for d, m in found if d.score > min_score]
    to_color = [(d, m) for d, m in kept if d.label in wanted]
    names = dict(zip((id(d) for d, _ in to_color), classifier.classify(image, to_color), strict=True))
    return [Detection(d.label, d.box, d.score, names.get(id(d))) for d, _ in kept]


DETECTORS: dict[str, str] = {
    "world": "vgrpo.world.detect:WorldDetector",
    "mask2former": "vgrpo.rewards.detectors:Mask2FormerDetector",
}
"""Detector names (what ``params/`` files say) to classes, imported only when selected."""


def detector_vocabulary(name: Any) -> Vocabulary | None:
    """The classes and colours the detector named ``name`` can report, from its class (nothing is loaded); None
    for recorded detections (whatever was recorded), a detector object or a class that does not name them."""
    if not isinstance(name, str) or name not in DETECTORS:
        return None
    module, _, attr = DETECTORS[name].partition(":")
    vocabulary = getattr(getattr(importlib.import_module(module), attr), "vocabulary", None)
    return None if vocabulary is None else cast(Vocabulary, vocabulary())


def build_detector(name: str, options: Mapping[str, Any] | None = None) -> Detector:
    """``world``, ``mask2former`` (options: config_path, checkpoint_path, clip_path, device) or ``recorded``
    (option: path to a JSONL of recorded detections)."""
    opts = dict(options or {})
    if name == "recorded":
        return RecordedDetector.from_jsonl(opts.pop("path"))
    if name not in DETECTORS:
        raise KeyError(f"unknown GenEval detector {name!r}; valid names: {sorted([*DETECTORS, 'recorded'])}")
    module, _, attr = DETECTORS[name].partition(":")
    detector: Detector = getattr(importlib.import_module(module), attr)(**opts)
    return detector
