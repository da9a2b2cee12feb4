"""GenEval's clause vocabulary (Ghosh et al. 2023): the six prompt tags, a detection, relative position, and the
checks of a prompt file's clauses (their structure, and the classes and colours a detector can see).

The ground floor that GenEval scoring (:mod:`vgrpo.rewards.geneval`) and anything that makes or detects
GenEval scenes (the embedded world, :mod:`vgrpo.world`) both import, so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "GENEVAL_TAGS",
    "Box",
    "Detection",
    "Vocabulary",
    "clause_problem",
    "extra_objects",
    "named_objects",
    "relative_position",
    "vocabulary_problem",
]

GENEVAL_TAGS: tuple[str, ...] = ("single_object", "two_object", "counting", "colors", "position", "color_attr")

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class Detection:
    """One detected object.

    Attributes:
        label: class name (GenEval's ``object_names.txt`` for real images; the world's shapes).
        box: ``(x0, y0, x1, y1)`` in pixels.
        score: detector confidence in [0, 1].
        color: colour name when known (the world detector reads it exactly; the Mask2Former detector fills it
            with CLIP zero-shot colour on the masked crop for classes a colour clause asks about), else None.
    """

    label: str
    box: Box
    score: float = 1.0
    color: str | None = None

    @property
    def center(self) -> tuple[float, float]:
        x0, y0, x1, y1 = self.box
        return ((x0 + x1) / 2, (y0 + y1) / 2)


def relative_position(a: Detection, b: Detection, threshold: float = 0.1) -> set[str]:
    """GenEval's ``relative_position``: relations of ``a`` to ``b`` from box centres, the offset shrunk by
    ``threshold * (dim_a + dim_b)`` per axis; a relation holds when its normalised component exceeds 0.5."""
    boxes = np.array([a.box, b.box], dtype=np.float64).reshape(2, 2, 2)
    center_a, center_b = boxes.mean(axis=-2)
    dim_a, dim_b = np.abs(np.diff(boxes, axis=-2))[..., 0, :]
    offset = center_a - center_b
    revised = np.maximum(np.abs(offset) - threshold * (dim_a + dim_b), 0) * np.sign(offset)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    rels: set[str] = set()
    if dx < -0.5:
        rels.add("left of")
    if dx > 0.5:
        rels.add("right of")
    if dy < -0.5:
        rels.add("above")
    if dy > 0.5:
        rels.add("below")
    return rels


def named_objects(metadata: Mapping[str, Any]) -> int:
    """How many objects a GenEval metadata row's include clauses name."""
    return sum(int(clause.get("count", 1)) for clause in metadata.get("include", []))


def extra_objects(metadata: Mapping[str, Any], objects: Sequence[Detection]) -> int:
    """How many more ``objects`` an image holds than ``metadata``'s include clauses name, of any class and colour (0
    when no more): the clutter GenEval's verdict lets pass, since it checks that the named objects are there, not
    that nothing else is."""
    return max(0, len(objects) - named_objects(metadata))


@dataclass(frozen=True)
class Vocabulary:
    """What a detector can report: ``classes`` and ``colors``; ``who`` names the detector in messages."""

    who: str
    classes: frozenset[str]
    colors: frozenset[str]


def _clause_error(clause: Any, where: str, index: int, earlier: int) -> str | None:
    if not isinstance(clause, dict):
        return f"{where}[{index}] must be an object with 'class' and 'count'"
    if not isinstance(clause.get("class"), str) or not clause["class"]:
        return f"{where}[{index}].class must be a non-empty string"
    count = clause.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        return f"{where}[{index}].count must be an integer >= 1, got {count!r}"
    if "color" in clause and not isinstance(clause["color"], str):
        return f"{where}[{index}].color must be a string"
    if "position" in clause:
        pos = clause["position"]
        if not (isinstance(pos, list) and len(pos) == 2 and isinstance(pos[0], str) and isinstance(pos[1], int)):
            return f"{where}[{index}].position must be [relation, index of an earlier include], got {pos!r}"
        if not 0 <= pos[1] < earlier:
            return f"{where}[{index}].position refers to include {pos[1]}, which is not an earlier clause"
    return None


def clause_problem(rows: Sequence[Mapping[str, Any]], path: str | Path) -> str | None:
    """The first row of ``rows`` (read from ``path``) whose GenEval clauses are malformed, as ``PATH: row N
    (PROMPT): what is wrong``; None when all are well formed. Rows with a ``tag`` and clauses are checked:
    ``include`` a list of ``{class, count[, color, position]}`` (``position`` pointing to an earlier include),
    ``exclude`` a list of ``{class, count}``; ``N`` counts the file's prompts from 1."""
    for lineno, row in enumerate(rows, 1):
        if "tag" not in row or ("include" not in row and "exclude" not in row):
            continue  # a plain prompt (OCR, preference): GenEval does not apply to it
        include, exclude = row.get("include", []), row.get("exclude", [])
        problem = None
        if not isinstance(include, list) or not isinstance(exclude, list):
            problem = "include and exclude must be lists"
        else:
            for i, clause in enumerate(include):
                problem = problem or _clause_error(clause, "include", i, i)
            for i, clause in enumerate(exclude):
                problem = problem or _clause_error(clause, "exclude", i, 0)
        if problem is not None:
            return f"{path}: row {lineno} ({row.get('prompt')!r}): {problem}"
    return None


def vocabulary_problem(rows: Sequence[Mapping[str, Any]], path: str | Path, vocabulary: Vocabulary) -> str | None:
    """The classes and colours that the GenEval clauses of ``rows`` (well formed: :func:`clause_problem`) name and
    ``vocabulary`` does not hold, in one line naming ``path``: the detector would never find them, and such a prompt
    could never score. None when it knows them all."""
    unknown: dict[str, str] = {}  # word -> the first prompt naming it
    for row in rows:
        if row.get("tag") not in GENEVAL_TAGS:
            continue
        for clause in [*row.get("include", []), *row.get("exclude", [])]:
            for word, known in ((clause.get("class"), vocabulary.classes), (clause.get("color"), vocabulary.colors)):
                if word is not None and word not in known:
                    unknown.setdefault(str(word), str(row["prompt"]))
    if not unknown:
        return None
    named = ", ".join(f"{w!r} (in {p!r})" for w, p in list(unknown.items())[:8])
    more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
    return f"{path}: GenEval clauses name {named}{more}, unknown to {vocabulary.who}"
