"""Prompt files: GenEval-format metadata JSONL (the world's splits, GenEval's and Flow-GRPO's metadata) and
plain text files with one prompt per line (Flow-GRPO's OCR and Pick-a-Pic prompts).

Files are read as UTF-8 text with a size cap, and every problem is reported with the file and line at fault
before any compute starts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vgrpo.errors import UserError

__all__ = ["MAX_PROMPT_FILE_BYTES", "PromptFileError", "check_geneval_metadata", "load_prompts"]

MAX_PROMPT_FILE_BYTES = 64 * 2**20
"""Larger prompt files are refused (Pick-a-Pic's 25k training prompts take 3 MB)."""
MAX_PROMPT_CHARS = 2000


class PromptFileError(UserError, ValueError):
    """A prompt file is missing, too large, empty or has a bad line; the message names the file and line."""


def load_prompts(path: str | Path, *, max_bytes: int = MAX_PROMPT_FILE_BYTES) -> list[dict[str, Any]]:
    """Metadata rows (each with a ``prompt``) from ``path``.

    ``.jsonl``: one JSON object per line with a non-empty string ``prompt`` (GenEval clauses and the world's
    fields are kept as they are). Any other suffix: one prompt per non-blank line, as ``{"prompt": line}``.
    """
    p = Path(path)
    if not p.is_file():
        raise PromptFileError(f"{p}: prompt file not found")
    size = p.stat().st_size
    if size > max_bytes:
        raise PromptFileError(f"{p}: {size} bytes is over the {max_bytes}-byte limit for a prompt file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PromptFileError(f"{p}: not UTF-8 text ({exc})") from exc
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
        else:
            row = {"prompt": line.strip()}
        if len(row["prompt"]) > MAX_PROMPT_CHARS:
            raise PromptFileError(f"{p}:{lineno}: prompt of {len(row['prompt'])} characters (limit {MAX_PROMPT_CHARS})")
        rows.append(row)
    if not rows:
        raise PromptFileError(f"{p}: prompt file is empty")
    return rows


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


def check_geneval_metadata(rows: Sequence[Mapping[str, Any]], path: str | Path) -> None:
    """GenEval clauses of every row that has a ``tag`` and clauses: ``include`` a list of ``{class, count[, color,
    position]}`` (``position`` pointing to an earlier include), ``exclude`` a list of ``{class, count}``. Run before
    any compute, so a bad row is reported with its file instead of failing the reward in the middle of a stage.

    Raises:
        PromptFileError: naming ``path``, the row's number among the file's prompts and what is wrong.
    """
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
            raise PromptFileError(f"{path}: row {lineno} ({row.get('prompt')!r}): {problem}")
