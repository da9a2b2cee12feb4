"""Prompt files: GenEval-format metadata JSONL (the world's splits, GenEval's and Flow-GRPO's metadata) and
plain text files with one prompt per line (Flow-GRPO's OCR and Pick-a-Pic prompts).

Files are read as UTF-8 text with a size cap, and every problem is reported with the file and line at fault
before any compute starts; what each reward needs of the rows (GenEval's clauses) is the reward's own check
(:meth:`vgrpo.rewards.base.Reward.check_prompts`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vgrpo.errors import UserError, read_user_text
from vgrpo.image_files import image_problem, summarised

__all__ = ["CONDITION_IMAGE_KEY", "MAX_PROMPT_FILE_BYTES", "PromptFileError", "load_prompts"]

CONDITION_IMAGE_KEY = "image"
"""The ``.jsonl`` row key naming an editing model's condition (source) image, a path relative to the prompt file
(Flow-GRPO's editing datasets use the same key); :func:`load_prompts` makes it absolute and checks it exists (and,
with ``open_images``, that it opens as an image)."""

MAX_PROMPT_FILE_BYTES = 64 * 2**20
"""Larger prompt files are refused (Pick-a-Pic's 25k training prompts take 3 MB)."""
MAX_PROMPT_CHARS = 2000


class PromptFileError(UserError, ValueError):
    """A prompt file is missing, too large, empty or has a bad line; the message names the file and line."""


def load_prompts(
    path: str | Path, *, max_bytes: int = MAX_PROMPT_FILE_BYTES, open_images: bool = False
) -> list[dict[str, Any]]:
    """Metadata rows (each with a ``prompt``) from ``path``.

    ``.jsonl``: one JSON object per line with a non-empty string ``prompt`` (GenEval clauses and the world's
    fields are kept as they are; a :data:`CONDITION_IMAGE_KEY` path is resolved against the file's folder and must
    name a file; with ``open_images`` the file is also read as an image, as the preflight does). Any other suffix:
    one prompt per non-blank line, as ``{"prompt": line}``. Every row's condition-image problem is listed in one
    error, a line each.
    """
    p = Path(path)
    text = read_user_text(p, "prompt file", max_bytes, PromptFileError)
    rows: list[dict[str, Any]] = []
    bad_images: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if p.suffix == ".jsonl":
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PromptFileError(f"{p}:{lineno}: not valid JSON ({exc.msg})") from exc
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
                raise PromptFileError(f"{p}:{lineno}: expected a JSON object with a non-empty string 'prompt'")
            if CONDITION_IMAGE_KEY in row:
                given = row[CONDITION_IMAGE_KEY]
                image = _condition_image(p, lineno, given)
                row[CONDITION_IMAGE_KEY] = str(image)
                problem = image_problem(image) if open_images else None if image.is_file() else "not found"
                if problem:
                    bad_images.append(f"{p}:{lineno}: condition image {given!r} {problem} (looked for {image})")
        else:
            row = {"prompt": line.strip()}
        if len(row["prompt"]) > MAX_PROMPT_CHARS:
            raise PromptFileError(f"{p}:{lineno}: prompt of {len(row['prompt'])} characters (limit {MAX_PROMPT_CHARS})")
        rows.append(row)
    if bad_images:
        raise PromptFileError("\n".join(summarised(bad_images, "condition images")))
    if not rows:
        raise PromptFileError(f"{p}: prompt file is empty")
    return rows


def _condition_image(path: Path, lineno: int, value: Any) -> Path:
    """A row's condition-image path, absolute (relative ones are relative to the prompt file's folder)."""
    if not isinstance(value, str) or not value.strip():
        raise PromptFileError(f"{path}:{lineno}: {CONDITION_IMAGE_KEY!r} must be a non-empty path string")
    return (path.parent / value).resolve()
