"""Prompts, metadata and ground-truth scenes for the procedural world.

Metadata follows GenEval (Ghosh et al. 2023) ``evaluation_metadata.jsonl`` exactly -- ``tag``, ``include``
clauses with ``class`` / ``count`` / optional ``color`` / optional ``position = [relation, index]``,
``exclude`` clauses, and ``prompt`` phrased as GenEval does ("a photo of three circles", "a photo of a circle
left of a square"). Two extra tags mirror Flow-GRPO's other rewards: ``ocr`` (``text`` field, quoted in the
prompt as in Flow-GRPO's ``ocr/test.txt``) and ``preference`` (free-form caption). :func:`make_splits` holds
out colour-shape pairs so the test split measures compositional generalisation.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from vgrpo.rewards.clauses import GENEVAL_TAGS, Detection, relative_position
from vgrpo.world.records import Record, scene_to_dict, write_jsonl
from vgrpo.world.records import read_jsonl as read_jsonl  # importable from here as before
from vgrpo.world.records import read_split as read_split
from vgrpo.world.records import scene_from_dict as scene_from_dict
from vgrpo.world.render import FONT_CHARS, max_text_chars, pixel_box
from vgrpo.world.scene import (
    COLORS,
    PLURALS,
    SHAPES,
    ObjectSpec,
    Scene,
    grid_cells,
    object_at,
    place_objects,
)

EXTRA_TAGS: tuple[str, ...] = ("ocr", "preference")
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
NUMBERS: dict[int, str] = {2: "two", 3: "three", 4: "four"}
COLOR_TAGS: tuple[str, ...] = ("colors", "color_attr")
"""The GenEval tags whose prompts name colour-shape pairs."""
# A word list reads better packed than one word a line.
OCR_WORDS: tuple[str, ...] = (
    "hi", "go", "yes", "no", "stop", "open", "sale", "cat", "dog", "sun", "2024", "42", "exit", "push", "pull",
    "park", "taxi", "bus", "cafe", "shop", "love", "home", "wifi", "free", "menu", "bar", "hot", "cold", "milk",
    "fish", "play", "fire", "help", "jazz", "king", "quiz", "vote", "box", "gym", "sky", "moon", "rain", "snow",
    "wind", "100", "365", "911", "777", "ice", "map", "web", "pet", "art", "ink", "joy", "key", "fun", "toy", "hat",
    "cup", "win", "run", "eat", "bike", "boat", "car", "city", "club", "cook", "desk", "door", "east", "west",
    "north", "south", "farm", "film", "fox", "gift", "gold", "hill", "hope", "idea", "jump", "kite", "lake", "lamp",
    "leaf", "lion", "mail", "mask", "mint", "note", "pie", "pink", "pizza", "plan", "port", "queen", "rock", "rose",
    "ruby", "salt", "ship", "silk", "star", "tent", "time", "town", "tree", "wolf", "yard", "zero", "one", "two",
    "six", "ten", "bank", "bell", "bird", "blue", "cake", "camp", "card", "coin", "corn", "crab", "deer", "dish",
    "duck", "egg", "fast", "frog", "game", "girl", "glow", "hand", "harp", "hen", "hero", "jet", "kid", "kiwi",
    "lime", "loud", "max", "meal", "mind", "net", "new", "owl", "pan", "pear", "pen", "pig", "pine", "pop", "rice",
    "ring", "road", "roof", "rope", "sock", "soup", "taco", "tiger", "tip", "top", "tub", "vet", "wall", "wax",
    "wing", "wish", "yak", "12", "25", "50", "64", "404", "500", "1984", "2000", "3000"
)  # fmt: skip
"""184 words of at most 5 glyphs (one line at 32 px), each read exactly from its ground-truth render by PP-OCR with
and without the text detector; enough of them that the base does not memorise every one (docs/embedded.md)."""
OCR_TEMPLATES: tuple[str, ...] = (
    'a sign that says "{t}"',
    'a black poster with the word "{t}" in white letters',
    'a screen displaying "{t}" under a row of shapes',
)

Pair = tuple[str, str]
"""``(color, shape)``."""


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _pick(rng: np.random.Generator, items: Iterable[str]) -> str:
    seq = list(items)
    return seq[int(rng.integers(len(seq)))]


def _pick_pair(rng: np.random.Generator, allowed: list[Pair], shapes: Iterable[str] | None = None) -> Pair:
    pool = [p for p in allowed if shapes is None or p[1] in set(shapes)]
    return pool[int(rng.integers(len(pool)))]


def sample_metadata(
    rng: np.random.Generator, tag: str, allowed: list[Pair], require: list[Pair] | None = None
) -> dict[str, Any]:
    """One metadata dict for ``tag`` whose explicitly named colour-shape pairs come from ``allowed``; when
    ``require`` is given, the ``colors`` / ``color_attr`` tags name one of those pairs."""
    if tag == "single_object":
        s = _pick(rng, SHAPES)
        return {"tag": tag, "include": [{"class": s, "count": 1}], "prompt": f"a photo of {_a(s)}"}
    if tag == "two_object":
        s1, s2 = (str(v) for v in rng.choice(SHAPES, size=2, replace=False))
        inc = [{"class": s1, "count": 1}, {"class": s2, "count": 1}]
        return {"tag": tag, "include": inc, "prompt": f"a photo of {_a(s1)} and {_a(s2)}"}
    if tag == "counting":
        s, n = _pick(rng, SHAPES), int(rng.integers(2, 5))
        return {
            "tag": tag,
            "include": [{"class": s, "count": n}],
            "exclude": [{"class": s, "count": n + 1}],
            "prompt": f"a photo of {NUMBERS[n]} {PLURALS[s]}",
        }
    if tag == "colors":
        c, s = _pick_pair(rng, require) if require else _pick_pair(rng, allowed)
        return {
            "tag": tag,
            "include": [{"class": s, "count": 1, "color": c}],
            "prompt": f"a photo of {_a(c + ' ' + s)}",
        }
    if tag == "position":
        s_ref, s_obj = (str(v) for v in rng.choice(SHAPES, size=2, replace=False))
        rel = _pick(rng, RELATIONS)
        inc = [{"class": s_ref, "count": 1}, {"class": s_obj, "count": 1, "position": [rel, 0]}]
        return {"tag": tag, "include": inc, "prompt": f"a photo of {_a(s_obj)} {rel} {_a(s_ref)}"}
    if tag == "color_attr":
        c1, s1 = _pick_pair(rng, require) if require else _pick_pair(rng, allowed)
        c2, s2 = _pick_pair(rng, allowed, [s for s in SHAPES if s != s1])
        if rng.random() < 0.5 and not require:
            (c1, s1), (c2, s2) = (c2, s2), (c1, s1)
        inc = [{"class": s1, "count": 1, "color": c1}, {"class": s2, "count": 1, "color": c2}]
        return {"tag": tag, "include": inc, "prompt": f"a photo of {_a(c1 + ' ' + s1)} and {_a(c2 + ' ' + s2)}"}
    if tag == "ocr":
        text = _pick(rng, OCR_WORDS)
        return {"tag": tag, "text": text, "prompt": _pick(rng, OCR_TEMPLATES).format(t=text)}
    if tag == "preference":
        c1, s1 = _pick_pair(rng, allowed)
        c2, s2 = _pick_pair(rng, allowed, [s for s in SHAPES if s != s1])
        rel = _pick(rng, RELATIONS)
        inc = [
            {"class": s2, "count": 1, "color": c2},
            {"class": s1, "count": 1, "color": c1, "position": [rel, 0]},
        ]
        caption = f"{_a(c1 + ' ' + s1)} {rel} {_a(c2 + ' ' + s2)} on a plain black background"
        return {"tag": tag, "include": inc, "prompt": caption}
    raise ValueError(f"unknown tag {tag!r}")


def _as_detection(o: ObjectSpec, size: int) -> Detection:
    x0, y0, side = pixel_box(o, size)
    return Detection(label=o.shape, color=o.color, box=(x0, y0, x0 + side, y0 + side))


def _relation_holds(a: ObjectSpec, b: ObjectSpec, rel: str, size: int = 32) -> bool:
    # A stricter dead zone than GenEval's 0.1 leaves a margin for rasterisation at other resolutions.
    return rel in relative_position(_as_detection(a, size), _as_detection(b, size), threshold=0.2)


def scene_for(metadata: dict[str, Any], rng: np.random.Generator, allowed: list[Pair] | None = None) -> Scene:
    """A ground-truth scene satisfying ``metadata``: exactly ``count`` objects per include clause (hence
    fewer than any exclude count), named colours, and positions by box centres. Unnamed colours are drawn
    from ``allowed`` pairs (all pairs by default)."""
    allowed = allowed if allowed is not None else [(c, s) for c in COLORS for s in SHAPES]
    tag = metadata.get("tag")
    text = metadata.get("text") if tag == "ocr" else None

    def color_for(req: dict[str, Any]) -> str:
        return str(req["color"]) if "color" in req else _pick_pair(rng, allowed, [req["class"]])[0]

    if tag == "ocr":
        n = int(rng.integers(0, 3))
        kinds = [(s, c) for c, s in (_pick_pair(rng, allowed) for _ in range(n))]
        return Scene(objects=place_objects(rng, kinds, has_text=True), text=text)
    includes = metadata.get("include", [])
    if any("position" in r for r in includes):
        # Position prompts have one object per clause (as in GenEval): draw cell pairs until every relation
        # holds unambiguously.
        cells = grid_cells()
        for _ in range(1000):
            order = rng.permutation(len(cells))[: len(includes)]
            objs = [
                object_at(cells[int(i)], req["class"], color_for(req)) for i, req in zip(order, includes, strict=True)
            ]
            rels_ok = all(
                _relation_holds(o, objs[int(r["position"][1])], r["position"][0])
                for o, r in zip(objs, includes, strict=True)
                if "position" in r
            )
            if rels_ok:
                return Scene(objects=tuple(objs), text=None)
        raise RuntimeError(f"could not satisfy {metadata['prompt']!r}")
    kinds = [(req["class"], color_for(req)) for req in includes for _ in range(int(req["count"]))]
    return Scene(objects=place_objects(rng, kinds), text=None)


def allowed_pairs(held_out: Iterable[tuple[str, str]]) -> list[Pair]:
    """Every ``(color, shape)`` pair except ``held_out`` (validated against the vocabulary)."""
    held = {(str(c), str(s)) for c, s in held_out}
    for c, s in held:
        if c not in COLORS or s not in SHAPES:
            raise ValueError(f"unknown held-out pair {(c, s)}: colours are {COLORS}, shapes {SHAPES}")
    return [(c, s) for c in COLORS for s in SHAPES if (c, s) not in held]


def make_splits(
    seed: int,
    n_train: int,
    n_test: int,
    held_out_pairs: Iterable[Pair] = (("red", "triangle"), ("blue", "circle")),
    tags: tuple[str, ...] = GENEVAL_TAGS,
) -> tuple[list[Record], list[Record]]:
    """Seeded train / test lists of ``(metadata, scene)``, tags cycled in order.

    No train prompt or ground-truth scene contains a held-out ``(color, shape)`` pair, and no test prompt names
    one: the test split's ``colors`` / ``color_attr`` prompts name seen pairs, as GenEval's colour prompts name
    objects its models saw. The held-out pairs are :func:`make_probe`'s. Ground-truth scenes of test prompts that
    name no colour draw colours from all pairs."""
    held = [(str(c), str(s)) for c, s in held_out_pairs]
    every = [(c, s) for c in COLORS for s in SHAPES]
    seen = allowed_pairs(held)
    rng = np.random.default_rng(seed)
    train: list[Record] = []
    for i in range(n_train):
        md = sample_metadata(rng, tags[i % len(tags)], seen)
        train.append((md, scene_for(md, rng, seen)))
    test: list[Record] = []
    for i in range(n_test):
        tag = tags[i % len(tags)]
        md = sample_metadata(rng, tag, seen if tag in COLOR_TAGS else every)
        test.append((md, scene_for(md, rng, every)))
    return train, test


def make_probe(
    seed: int, n: int, held_out_pairs: Iterable[Pair] = (("red", "triangle"), ("blue", "circle"))
) -> list[Record]:
    """The compositional-generalisation probe: ``n`` seeded ``colors`` / ``color_attr`` prompts (alternating),
    each naming a held-out ``(color, shape)`` pair that no training prompt or render contains, with their
    ground-truth scenes. RL on the seen pairs cannot be expected to teach these; they are reported on their own,
    outside the headline score. Drawn from its own stream of ``seed``, so the train and test splits do not depend
    on ``n``."""
    held = [(str(c), str(s)) for c, s in held_out_pairs]
    every = [(c, s) for c in COLORS for s in SHAPES]
    allowed_pairs(held)  # validates the pairs
    rng = np.random.default_rng([seed, 1])
    probe: list[Record] = []
    for i in range(n):
        md = sample_metadata(rng, COLOR_TAGS[i % len(COLOR_TAGS)], every, held)
        probe.append((md, scene_for(md, rng, every)))
    return probe


VALIDATION_DRAWS = 1000
"""Draws per validation row to find a prompt text outside the test split before a tag counts as closed."""


def make_validation(
    seed: int,
    n: int,
    test_prompts: Iterable[str],
    held_out_pairs: Iterable[Pair] = (("red", "triangle"), ("blue", "circle")),
    tags: tuple[str, ...] = GENEVAL_TAGS,
) -> list[Record]:
    """The validation split: ``n`` seeded rows drawn as :func:`make_splits` draws the test split (tags cycled in
    the same order, colour prompts naming seen pairs, ground-truth scenes from every pair), from its own stream of
    ``seed`` (so the train and test splits do not depend on ``n``), each prompt text outside ``test_prompts``.

    The world's vocabulary is small: a tag whose every prompt text is in the test split (``single_object`` has 3,
    ``two_object`` 6, ``counting`` 9, ``colors`` 10 seen pairs, ``position`` 24; the 560-prompt test split holds
    them all) has no text left to draw, so after :data:`VALIDATION_DRAWS` draws a row of such a *closed* tag keeps
    its first draw. Those rows differ from the test split's by their images only: recipe selection evaluates
    validation with another noise seed (``params/embedded/validation.yaml``). Tags with texts to spare
    (``color_attr``, ``ocr``) get texts the test split never shows (:func:`closed_tags` names the others)."""
    test = set(test_prompts)
    held = [(str(c), str(s)) for c, s in held_out_pairs]
    every = [(c, s) for c in COLORS for s in SHAPES]
    seen = allowed_pairs(held)
    rng = np.random.default_rng([seed, 2])
    rows: list[Record] = []
    for i in range(n):
        tag = tags[i % len(tags)]
        pairs = seen if tag in COLOR_TAGS else every
        md = first = sample_metadata(rng, tag, pairs)
        draws = 1
        while md["prompt"] in test and draws < VALIDATION_DRAWS:
            md, draws = sample_metadata(rng, tag, pairs), draws + 1
        if md["prompt"] in test:  # a closed tag
            md = first
        rows.append((md, scene_for(md, rng, every)))
    return rows


def closed_tags(validation: Iterable[Record], test_prompts: Iterable[str]) -> list[str]:
    """The tags of ``validation`` rows whose prompt text is also a test prompt: tags whose texts the test split
    exhausts (:func:`make_validation`)."""
    test = set(test_prompts)
    return sorted({str(md["tag"]) for md, _ in validation if md["prompt"] in test})


def write_splits(
    out_dir: str | Path,
    seed: int,
    n_train: int,
    n_test: int,
    *,
    held_out_pairs: Iterable[Pair],
    tags: tuple[str, ...],
    n_probe: int = 0,
    n_validation: int = 0,
) -> tuple[int, int, int, int]:
    """:func:`make_splits` written to ``train.jsonl`` and ``test.jsonl`` in ``out_dir``, :func:`make_probe`
    to ``probe.jsonl`` (with ``n_probe``) and :func:`make_validation` to ``validation.jsonl`` (with
    ``n_validation``), each row with its ground-truth ``scene``; returns the four sizes. The train, test and probe
    files do not depend on ``n_validation``."""
    held = [(str(c), str(s)) for c, s in held_out_pairs]
    train, test = make_splits(seed, n_train, n_test, held_out_pairs=held, tags=tags)
    probe = make_probe(seed, n_probe, held) if n_probe else []
    test_texts = [str(md["prompt"]) for md, _ in test]
    validation = make_validation(seed, n_validation, test_texts, held, tags) if n_validation else []
    files = (("train", train), ("test", test), ("probe", probe), ("validation", validation))
    for name, records in files:
        if (name == "probe" and not n_probe) or (name == "validation" and not n_validation):
            continue
        write_jsonl(Path(out_dir) / f"{name}.jsonl", ({**md, "scene": scene_to_dict(sc)} for md, sc in records))
    return len(train), len(test), len(probe), len(validation)


def ocr_text_ok(text: str, size: int = 32) -> bool:
    """Whether ``text`` renders losslessly on one line of a ``size`` canvas with the built-in font."""
    return len(text) <= max_text_chars(size) and all(ch in FONT_CHARS for ch in text.lower())
