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
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class _Sources:
    """An evaluation's counting samples, read and checked: its prompt rows, credit marks and images folder."""

    rows: list[dict[str, Any]]
    credited: list[list[Any]]
    images_dir: Path
    inputs: dict[str, Path]
    """What it was read from, by label: no output may overwrite these."""


def _read_sources(sources: Path) -> _Sources:
    """The evaluation at ``sources`` (UserError naming ``--sources`` when it, its scores or its prompt file do not
    read as ``vgrpo evaluate --images`` writes them)."""
    from vgrpo.evaluation.report import read_evaluation, scores_path
    from vgrpo.prompts import load_prompts

    table = read_evaluation(sources, label="--sources")
    images_dir, prompt_file = table.get("images_dir"), table.get("prompt_file")
    credited = table["per_prompt"].get("credited")
    if not isinstance(images_dir, str) or not isinstance(credited, list) or not isinstance(prompt_file, str):
        raise UserError(f"--sources {sources}: an evaluation written with --images and a GenEval reward is needed")
    if not all(isinstance(marks, list) for marks in credited):
        raise UserError(f"--sources {sources}: its scores' `credited` is not a list of per-sample marks per prompt")
    try:
        rows = load_prompts(prompt_file)
    except UserError as exc:
        raise UserError(f"--sources {sources} names the prompt file {prompt_file}: {exc}") from exc
    if len(rows) < len(credited):
        raise UserError(
            f"--sources {sources}: {len(credited)} prompts scored, but {prompt_file} has {len(rows)} rows (changed?)"
        )
    inputs = {"--sources": sources, "--sources scores": scores_path(sources)}
    inputs["--sources prompt file"] = Path(prompt_file)
    inputs["--sources images folder"] = Path(images_dir)  # the sources are copied from here: --out stays apart
    return _Sources(rows[: len(credited)], credited, Path(images_dir), inputs)


def _edited(source: _Sources) -> list[tuple[int, int]]:
    """``(row, sample)`` of every sample an edit is made of: credited, of a counting row."""
    return [
        (i, k)
        for i, (row, marks) in enumerate(zip(source.rows, source.credited, strict=True))
        if row.get("tag") == "counting"
        for k, mark in enumerate(marks)
        if mark is True
    ]


def _source_problems(sources: Path, source: _Sources) -> list[str]:
    """Every counting row that is not GenEval's, and every source image that is missing, does not open as an image or
    is not the size most of them have (one evaluation samples one size)."""
    from vgrpo.evaluation.report import sample_png_name
    from vgrpo.image_files import image_problem, image_size, summarised

    out = []
    for i, row in enumerate(source.rows):
        if row.get("tag") == "counting":
            try:
                source_clause(row)
            except (ValueError, KeyError, TypeError) as exc:
                out.append(f"--sources {sources}: prompt row {i} of its prompt file: {exc}")
    paths = [source.images_dir / sample_png_name(i, k) for i, k in _edited(source)]
    sizes = Counter(found for path in paths if (found := image_size(path)) is not None)
    size = sizes.most_common(1)[0][0] if sizes else None  # the evaluation's, which a stray file does not outvote
    images = [f"--sources {sources}: source image {p} {why}" for p in paths if (why := image_problem(p, size))]
    return out + summarised(images, "source images")


def write_edit_set(sources: str | Path, out: str | Path, *, seed: int = 0) -> dict[str, int]:
    """A real model's counting-edit set from its samples of GenEval counting prompts.

    ``sources`` is an evaluation written by ``vgrpo evaluate PIPELINE --prompts COUNTING.jsonl --out SOURCES
    --images DIR`` with GenEval among its rewards: each sample GenEval credits (it shows its prompt's count) gives
    one edit row, its image copied to ``out/images/NNNNN-K.png``. The source prompts are shuffled by ``seed`` and
    split by :data:`SPLITS` (the samples of one prompt stay in one split) into ``out/<split>.jsonl``. Returns the
    rows per split, and ``dropped``: the samples GenEval does not credit or that are not of a counting row.

    Everything is checked before anything is written (every source image opened; ``out`` apart from every input,
    the images folder included), and ``out`` is written whole in a temporary folder renamed over it, so a failed
    command leaves no partial set.

    Raises:
        UserError: ``sources`` missing or malformed, written without ``--images`` or without per-image credit marks,
            a source image that does not read, or an ``out`` that overlaps an input; every problem in one message.
    """
    from vgrpo.atomic import atomic_dir
    from vgrpo.evaluation.report import sample_png_name, scores_path
    from vgrpo.outputs import Output, output_problems

    sources, out = Path(sources), Path(out)
    inputs = {"--sources": sources, "--sources scores": scores_path(sources)}
    source: _Sources | None = None
    try:
        source = _read_sources(sources)
    except UserError as exc:
        problems = str(exc).splitlines()
    else:
        inputs, problems = source.inputs, _source_problems(sources, source)
    problems += output_problems([Output("--out", out)], inputs)
    if problems or source is None:
        # vgrpo.training.preflight's wording without its imports, which would make this DVC stage depend on training
        count = f"{len(problems)} problem{'' if len(problems) == 1 else 's'}"
        raise UserError(f"edit-set found {count} before writing anything:\n" + "\n".join(f"  - {p}" for p in problems))
    rng = np.random.default_rng(seed)
    edits: list[list[tuple[str, dict[str, Any]]]] = [[] for _ in source.rows]
    for i, k in _edited(source):
        row = source.rows[i]
        name = row["prompt"].split(" ", 4)[-1]  # after "a photo of <count>": the plural, "wine glasses"
        image = f"images/{sample_png_name(i, k)}"
        edits[i].append((image, counting_edit_row(row, draw_target(source_clause(row)[1], rng), image, name)))
    order = rng.permutation(len(edits))
    images_dir = source.images_dir

    def write(tmp: Path) -> None:
        (tmp / "images").mkdir()
        for image, _ in (edit for row_edits in edits for edit in row_edits):
            shutil.copyfile(images_dir / Path(image).name, tmp / image)
        start = 0
        for n, (split, share) in enumerate(SPLITS.items()):
            end = len(edits) if n == len(SPLITS) - 1 else start + round(share * len(edits))
            rows = [row for i in sorted(int(j) for j in order[start:end]) for _, row in edits[i]]
            write_text_atomic(tmp / f"{split}.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
            written[split], start = len(rows), end

    written: dict[str, int] = {}
    atomic_dir(out, write)
    dropped = sum(len(marks) for marks in source.credited) - sum(len(e) for e in edits)
    return written | {"dropped": dropped}
