"""Training data for the embedded world's learned reward models: hard-negative captions, mild augmentations
and the degradations that make the rejected image of a preference pair.

* :func:`hard_negative` changes exactly one attribute of a world caption -- a colour, a shape, a count, a
  relation or the quoted OCR word -- so that the caption no longer describes the render (NegCLIP's
  attribute-swap negatives, Yuksekgonul et al. 2023, Sec. 4).
* :func:`augment` is the mild blur / noise / shift / colour jitter put on every training render, so that scores
  transfer to what the generator draws (its samples are slightly soft and off-colour).
* :func:`degrade` makes the worse image of a preference pair; :data:`DEGRADATIONS` lists the kinds: pixel-level
  (``blur``, ``noise``, ``color_shift``), ``clutter`` (extra distractor shapes) and prompt violations
  (``wrong_color``, ``wrong_shape``, ``wrong_position``) that re-render an edited ground-truth scene.

Images are ``uint8 (H, W, 3)``; everything is pure numpy driven by a :class:`numpy.random.Generator`.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import numpy as np

from vgrpo.world.prompts import NUMBERS, OCR_WORDS, Pair, sample_metadata, scene_for
from vgrpo.world.render import render
from vgrpo.world.scene import CELL_CENTERS, COLORS, PLURALS, SHAPES, Scene, grid_cells, object_at

__all__ = [
    "DEGRADATIONS",
    "NEGATIVE_KINDS",
    "NoRoomError",
    "augment",
    "degrade",
    "gaussian_blur",
    "hard_negative",
    "sample_pair",
]

DEGRADATIONS: tuple[str, ...] = (
    "blur",
    "noise",
    "color_shift",
    "clutter",
    "wrong_color",
    "wrong_shape",
    "wrong_position",
)
NEGATIVE_KINDS: tuple[str, ...] = ("color", "shape", "count", "relation", "text")
_OPPOSITE = {"left": "right", "right": "left", "above": "below", "below": "above"}
_SINGULAR = {p: s for s, p in PLURALS.items()}
_QUOTED = re.compile(r'"([^"]*)"')


class NoRoomError(RuntimeError):
    """A scene leaves a degradation nothing to do: ``clutter`` finds no free cell, or ``wrong_shape`` /
    ``wrong_color`` no allowed value the prompt does not name (with 3 shapes, a two-shape prompt leaves one
    shape, which a held-out pair may exclude for the object's colour)."""


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def hard_negative(caption: str, rng: np.random.Generator) -> tuple[str, str]:
    """``(kind, caption')``: ``caption`` with one attribute changed to a value it does not name, so that it is
    false for the caption's ground-truth render. Relations flip to their opposite (a diagonal layout may hold
    two relations at once), counts change number, colours and shapes take a value absent from the caption.

    Raises:
        ValueError: when the caption names no attribute of :data:`NEGATIVE_KINDS`.
    """
    words = caption.split(" ")
    named = set(words)
    slots: dict[str, list[int]] = {k: [] for k in NEGATIVE_KINDS}
    for i, w in enumerate(words):
        if w in COLORS:
            slots["color"].append(i)
        elif w in SHAPES or w in _SINGULAR:
            slots["shape"].append(i)
        elif w in NUMBERS.values():
            slots["count"].append(i)
        elif w in _OPPOSITE:
            slots["relation"].append(i)
    quoted = _QUOTED.search(caption)
    kinds = [k for k in NEGATIVE_KINDS if slots[k]] + (["text"] if quoted else [])
    if not kinds:
        raise ValueError(f"no colour, shape, count, relation or quoted text to change in {caption!r}")
    kind = kinds[int(rng.integers(len(kinds)))]
    if kind == "text":
        assert quoted is not None
        options = [w for w in OCR_WORDS if w != quoted.group(1)]
        word = options[int(rng.integers(len(options)))]
        return kind, caption[: quoted.start(1)] + word + caption[quoted.end(1) :]
    i = slots[kind][int(rng.integers(len(slots[kind])))]
    old = words[i]
    if kind == "relation":
        new = _OPPOSITE[old]
    elif kind == "color":
        new = _choice(rng, [c for c in COLORS if c not in named])
    elif kind == "count":
        new = _choice(rng, [n for n in NUMBERS.values() if n != old])
    else:
        named_shapes = {_SINGULAR.get(w, w) for w in named}
        shape = _choice(rng, [s for s in SHAPES if s not in named_shapes])
        new = PLURALS[shape] if old in _SINGULAR else shape
    words[i] = new
    if i > 0 and words[i - 1] in ("a", "an"):
        words[i - 1] = _article(new)
    return kind, " ".join(words)


def _choice(rng: np.random.Generator, options: list[str]) -> str:
    return options[int(rng.integers(len(options)))]


def gaussian_blur(image: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur of a ``uint8 (H, W, 3)`` image (radius ``ceil(3 sigma)``, edges reflected)."""
    if sigma <= 0:
        return image.copy()
    r = int(np.ceil(3 * sigma))
    k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma) ** 2)
    k /= k.sum()
    x = np.pad(image.astype(np.float64), ((r, r), (r, r), (0, 0)), mode="reflect")
    x = sum(k[j] * x[j : j + image.shape[0]] for j in range(2 * r + 1))
    x = sum(k[j] * x[:, j : j + image.shape[1]] for j in range(2 * r + 1))
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def _noise(image: np.ndarray, std: float, rng: np.random.Generator) -> np.ndarray:
    return np.clip(np.rint(image + rng.normal(0.0, std, image.shape)), 0, 255).astype(np.uint8)


def augment(
    image: np.ndarray,
    rng: np.random.Generator,
    *,
    shift_px: int,
    color_jitter: float,
    blur_prob: float,
    blur_sigma_max: float,
    noise_std_max: float,
) -> np.ndarray:
    """A mildly perturbed copy of ``image``: a shift of up to ``shift_px`` pixels (background fill), per-channel
    gain ``1 +- color_jitter``, with probability ``blur_prob`` a blur of sigma up to ``blur_sigma_max``, and
    Gaussian noise of std up to ``noise_std_max`` (in 0-255 units)."""
    h, w, _ = image.shape
    out = np.zeros_like(image)
    dy, dx = (int(v) for v in rng.integers(-shift_px, shift_px + 1, size=2))
    out[max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = image[
        max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)
    ]
    gain = 1.0 + rng.uniform(-color_jitter, color_jitter, size=3)
    out = np.clip(np.rint(out * gain), 0, 255).astype(np.uint8)
    if rng.random() < blur_prob:
        out = gaussian_blur(out, float(rng.uniform(0.3, blur_sigma_max)))
    return _noise(out, float(rng.uniform(0.0, noise_std_max)), rng)


def _supports(kind: str, metadata: dict[str, Any]) -> bool:
    clauses = metadata.get("include", [])
    if kind == "wrong_color":
        return any("color" in c for c in clauses)
    if kind == "wrong_shape":
        return bool(clauses)
    if kind == "wrong_position":
        return any("position" in c for c in clauses)
    return True


def degrade(
    scene: Scene,
    metadata: dict[str, Any],
    kind: str,
    rng: np.random.Generator,
    allowed: list[Pair],
    *,
    size: int,
    strength: dict[str, tuple[float, float]],
) -> np.ndarray:
    """A worse render of ``scene`` (which satisfies ``metadata``) by degradation ``kind``.

    ``strength`` maps ``blur`` (sigma), ``noise`` (std, 0-255), ``color_shift`` (per-channel offset, 0-255) and
    ``clutter`` (number of extra objects) to ``(low, high)`` ranges. Scene edits (``clutter``, ``wrong_*``) use
    ``(colour, shape)`` pairs from ``allowed`` only. Objects of ``scene`` are in include-clause order, as
    :func:`vgrpo.world.prompts.scene_for` makes them.

    Raises:
        ValueError: for an unknown ``kind`` or one that ``metadata`` gives nothing to violate.
        NoRoomError: when the scene leaves the degradation nothing to change (see :class:`NoRoomError`).
    """
    if kind not in DEGRADATIONS:
        raise ValueError(f"unknown degradation {kind!r}; valid: {DEGRADATIONS}")
    if not _supports(kind, metadata):
        raise ValueError(f"degradation {kind!r} needs a prompt that names it, got {metadata.get('prompt')!r}")
    lo, hi = strength.get(kind, (0.0, 0.0))
    if kind == "blur":
        return gaussian_blur(render(scene, size), float(rng.uniform(lo, hi)))
    if kind == "noise":
        return _noise(render(scene, size), float(rng.uniform(lo, hi)), rng)
    if kind == "color_shift":
        offset = rng.uniform(lo, hi, size=3) * rng.choice([-1.0, 1.0], size=3)
        return np.clip(np.rint(render(scene, size) + offset), 0, 255).astype(np.uint8)
    objs = list(scene.objects)
    clauses = [c for c in metadata.get("include", []) for _ in range(int(c["count"]))]
    if kind == "clutter":
        taken = {(CELL_CENTERS.index(o.x), CELL_CENTERS.index(o.y)) for o in objs}
        free = [cell for cell in grid_cells(scene.text is not None) if cell not in taken]
        if not free:
            raise NoRoomError(f"no room for a distractor in the scene of {metadata.get('prompt')!r}")
        extra = min(len(free), int(rng.integers(int(lo), int(hi) + 1)))
        for i in rng.permutation(len(free))[:extra]:
            color, shape = allowed[int(rng.integers(len(allowed)))]
            objs.append(object_at(free[int(i)], shape, color))
    elif kind == "wrong_color":
        i = _choice_index(rng, [j for j, c in enumerate(clauses) if "color" in c])
        options = [c for c, s in allowed if s == objs[i].shape and c != objs[i].color]
        if not options:
            raise NoRoomError(f"no allowed colour left for the {objs[i].shape} of {metadata.get('prompt')!r}")
        objs[i] = replace(objs[i], color=_choice(rng, options))
    elif kind == "wrong_shape":
        i = _choice_index(rng, list(range(len(clauses))))
        named = {c["class"] for c in clauses}
        options = [s for c, s in allowed if c == objs[i].color and s not in named]
        if not options:
            raise NoRoomError(f"no allowed shape left for the {objs[i].color} object of {metadata.get('prompt')!r}")
        objs[i] = replace(objs[i], shape=_choice(rng, options))
    else:  # wrong_position: swapping the two centres flips every relation and keeps the boxes apart
        a, b = objs[0], objs[1]
        objs[0], objs[1] = replace(a, x=b.x, y=b.y), replace(b, x=a.x, y=a.y)
    return render(Scene(objects=tuple(objs), text=scene.text), size)


def _choice_index(rng: np.random.Generator, options: list[int]) -> int:
    return options[int(rng.integers(len(options)))]


def sample_pair(
    rng: np.random.Generator,
    kind: str,
    tags: tuple[str, ...],
    allowed: list[Pair],
    *,
    size: int,
    strength: dict[str, tuple[float, float]],
) -> tuple[str, np.ndarray, np.ndarray]:
    """``(caption, preferred, rejected)``: a clean render of a fresh prompt whose tag (drawn uniformly from
    ``tags``) names what ``kind`` violates, and its degradation; a scene with no room for clutter is redrawn.
    Raises ``ValueError`` if no tag can."""
    for _ in range(1000):
        md = sample_metadata(rng, tags[int(rng.integers(len(tags)))], allowed)
        if _supports(kind, md):
            scene = scene_for(md, rng, allowed)
            try:
                rejected = degrade(scene, md, kind, rng, allowed, size=size, strength=strength)
            except NoRoomError:
                continue
            return str(md["prompt"]), render(scene, size), rejected
    raise ValueError(f"none of the tags {tags} gives prompts that degradation {kind!r} can violate")
