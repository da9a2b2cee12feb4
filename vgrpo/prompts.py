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

__all__ = ["CONDITION_IMAGE_KEY", "MAX_PROMPT_FILE_BYTES", "PromptFileError", "load_prompts"]

CONDITION_IMAGE_KEY = "image"
"""The ``.jsonl`` row key naming an editing model's condition (source) image, a path relative to the prompt file
(Flow-GRPO's editing datasets use the same key); :func:`load_prompts` makes it absolute and checks it exists."""

MAX_PROMPT_FILE_BYTES = 64 * 2**20
"""Larger prompt files are refused (Pick-a-Pic's 25k training prompts take 3 MB)."""
MAX_PROMPT_CHARS = 2000


class PromptFileError(UserError, ValueError):
    """A prompt file is missing, too large, empty or has a bad line; the message names the file and line."""


def load_prompts(path: str | Path, *, max_bytes: int = MAX_PROMPT_FILE_BYTES) -> list[dict[str, Any]]:
    """Metadata rows (each with a ``prompt``) from ``path``.

    ``.jsonl``: one JSON object per line with a non-empty string ``prompt`` (GenEval clauses and the world's
    fields are kept as they are; a :data:`CONDITION_IMAGE_KEY` path is resolved against the file's folder and must
    name a file). Any other suffix: one prompt per non-blank line, as ``{"prompt": line}``.
    """
    p = Path(path)
    text = read_user_text(p, "prompt file", max_bytes, PromptFileError)
    rows: list[dict[str, Any]] = []
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
                row[CONDITION_IMAGE_KEY] = _condition_image(p, lineno, row[CONDITION_IMAGE_KEY])
        else:
            row = {"prompt": line.strip()}
        if len(row["prompt"]) > MAX_PROMPT_CHARS:
            raise PromptFileError(f"{p}:{lineno}: prompt of {len(row['prompt'])} characters (limit {MAX_PROMPT_CHARS})")
        rows.append(row)
    if not rows:
        raise PromptFileError(f"{p}: prompt file is empty")
    return rows


def _condition_image(path: Path, lineno: int, value: Any) -> str:
    """A row's condition-image path, absolute (relative ones are relative to the prompt file's folder)."""
    if not isinstance(value, str) or not value.strip():
        raise PromptFileError(f"{path}:{lineno}: {CONDITION_IMAGE_KEY!r} must be a non-empty path string")
    image = (path.parent / value).resolve()
    if not image.is_file():
        raise PromptFileError(f"{path}:{lineno}: condition image {value!r} not found (looked for {image})")
    return str(image)
