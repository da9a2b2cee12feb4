"""The counting-edit task: an editing family's prompt rows with a verifiable reward (Flow-GRPO's Kontext recipe).

Flow-GRPO trains FLUX.1-Kontext on *counting edits*: a source image generated from a GenEval counting prompt ("a
photo of three clocks"), the instruction "Change the number of clock in the image to two.", and GenEval counting
metadata for the edited image (``include`` the target count, ``exclude`` one more), so that GenEval's detector
scores the edit and an image-similarity reward what it keeps. A row here is that: a prompt row an editing family
reads (:data:`vgrpo.prompts.CONDITION_IMAGE_KEY` names the source image, relative to the prompt file) with GenEval's
keys, Flow-GRPO's ``t2i_prompt`` (the source's own prompt) and ``source_count``.

Two sets are built from it: the world's (:mod:`vgrpo.world.edits`: the sources are ground-truth renders), and a real
model's (:func:`write_edit_set`: the sources are a text-to-image model's samples of GenEval counting prompts,
``vgrpo evaluate ... --images DIR`` of :func:`counting_prompts`, kept where GenEval credits the source with its own
count).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vgrpo.atomic import write_text_atomic
from vgrpo.errors import UserError
from vgrpo.prompts import CONDITION_IMAGE_KEY

__all__ = [
    "COUNT_WORDS",
    "EDIT_COUNTS",
    "SPLITS",
    "counting_edit_row",
    "counting_prompts",
    "draw_target",
    "edit_instruction",
    "geneval_plural",
    "source_clause",
    "write_edit_set",
]

EDIT_COUNTS: tuple[int, ...] = (1, 2, 3, 4)
"""Counts an edit asks for: GenEval's counting prompts' 2-4 and one (a removal down to a single object)."""
COUNT_WORDS: dict[int, str] = {1: "one", 2: "two", 3: "three", 4: "four"}
SPLITS: dict[str, float] = {"train": 0.8, "validation": 0.1, "test": 0.1}
"""The share of a real model's source prompts each split of its edit set gets (:func:`write_edit_set`)."""


def edit_instruction(name: str, count: int) -> str:
    """The instruction to change the number of ``name`` (the class as the prompt names it: "clocks", "circles") to
    ``count``: "Change the number of clocks in the image to two."."""
    return f"Change the number of {name} in the image to {COUNT_WORDS[count]}."


def source_clause(metadata: Mapping[str, Any]) -> tuple[str, int]:
    """``(class, count)`` of a GenEval ``counting`` row (one include clause); anything else is a ValueError."""
    includes = metadata.get("include", ())
    if metadata.get("tag") != "counting" or len(includes) != 1 or "class" not in includes[0]:
        raise ValueError(f"not a GenEval counting row: {metadata.get('prompt')!r}")
    return str(includes[0]["class"]), int(includes[0]["count"])


def draw_target(source_count: int, rng: np.random.Generator) -> int:
    """A count of :data:`EDIT_COUNTS` other than ``source_count``, uniformly."""
    return int(rng.choice([c for c in EDIT_COUNTS if c != source_count]))


def counting_edit_row(metadata: Mapping[str, Any], target: int, image: str, name: str) -> dict[str, Any]:
    """The edit row that asks the source of the counting row ``metadata`` (its image at ``image``, relative to the
    prompt file) for ``target`` objects of its class, ``name`` the class as the instruction says it."""
    cls, source_count = source_clause(metadata)
    if target == source_count or target not in COUNT_WORDS:
        raise ValueError(f"target count {target} for a source of {source_count}: not an edit of {EDIT_COUNTS}")
    return {
        "tag": "counting",
        "include": [{"class": cls, "count": target}],
        "exclude": [{"class": cls, "count": target + 1}],
        "prompt": edit_instruction(name, target),
        CONDITION_IMAGE_KEY: image,
        "t2i_prompt": metadata["prompt"],
        "source_count": source_count,
    }


def geneval_plural(name: str) -> str:
    """GenEval's plural of a class name, as its counting prompts spell it ("clocks", "buses", "benchs")."""
    return name + ("es" if name.endswith("s") else "s")


def counting_prompts(names: Sequence[str], counts: Sequence[int] = (2, 3, 4)) -> list[dict[str, Any]]:
    """GenEval ``counting`` rows, one per class and count, worded as GenEval's: "a photo of three clocks" with
    ``include`` the count and ``exclude`` one more (the source prompts of a real model's edit set)."""
    return [
        {
            "tag": "counting",
            "include": [{"class": name, "count": count}],
            "exclude": [{"class": name, "count": count + 1}],
            "prompt": f"a photo of {COUNT_WORDS[count]} {geneval_plural(name)}",
        }
        for name in names
        for count in counts
    ]


def write_edit_set(sources: str | Path, out: str | Path, *, seed: int = 0) -> dict[str, int]:
    """A real model's counting-edit set from its samples of GenEval counting prompts.

    ``sources`` is an evaluation written by ``vgrpo evaluate PIPELINE --prompts COUNTING.jsonl --out SOURCES
    --images DIR`` with GenEval among its rewards: each sample GenEval credits (it shows its prompt's count) gives
    one edit row, its image copied to ``out/images/NNNNN-K.png``. The source prompts are shuffled by ``seed`` and
    split by :data:`SPLITS` (the samples of one prompt stay in one split) into ``out/<split>.jsonl``. Returns the
    rows per split, and ``dropped``: the samples GenEval does not credit or that are not of a counting row.

    Raises:
        UserError: ``sources`` missing, written without ``--images`` or without per-image credit marks.
    """
    from vgrpo.evaluation.report import read_evaluation, sample_png_name, scores_path
    from vgrpo.prompts import load_prompts

    for path in (Path(sources), scores_path(sources)):
        if not path.is_file():
            raise UserError(f"--sources {sources}: {path} does not exist (written by `vgrpo evaluate --out {sources}`)")
    table = read_evaluation(sources)
    images_dir, prompt_file = table.get("images_dir"), table.get("prompt_file")
    credited = table["per_prompt"].get("credited")
    if images_dir is None or credited is None:
        raise UserError(f"--sources {sources}: an evaluation written with --images and a GenEval reward is needed")
    metadata = load_prompts(str(prompt_file))[: len(credited)]
    rng = np.random.default_rng(seed)
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    edits: list[list[dict[str, Any]]] = []
    dropped = 0
    for i, (row, marks) in enumerate(zip(metadata, credited, strict=True)):
        edits.append([])
        if row.get("tag") != "counting":
            dropped += len(marks)
            continue
        source_count = source_clause(row)[1]
        name = row["prompt"].split(" ", 4)[-1]  # after "a photo of <count>": the plural, "wine glasses"
        for k, mark in enumerate(marks):
            if mark is not True:
                dropped += 1
                continue
            image = f"images/{sample_png_name(i, k)}"
            shutil.copyfile(Path(images_dir) / sample_png_name(i, k), out / image)
            edits[i].append(counting_edit_row(row, draw_target(source_count, rng), image, name))
    order = rng.permutation(len(edits))
    written: dict[str, int] = {}
    start = 0
    for n, (split, share) in enumerate(SPLITS.items()):
        end = len(edits) if n == len(SPLITS) - 1 else start + round(share * len(edits))
        rows = [row for i in sorted(int(j) for j in order[start:end]) for row in edits[i]]
        write_text_atomic(out / f"{split}.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
        written[split], start = len(rows), end
    return written | {"dropped": dropped}
