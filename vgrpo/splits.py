"""Which split a prompt file is, and the rule that recipe selection never reads the test split.

A setting is chosen on the validation split; only a final report reads the test split, and only for a recipe whose
choices are on record. Commands that tune (a curriculum's runs over seeds, a paired tuning table, a sweep) call
:func:`tuning_prompt_problems` on every prompt file they will evaluate, before any compute; the final-report path calls
:func:`choice_record_problems` on the recipe's ``choices`` and writes :func:`split_record` beside its numbers, so a
reader can check which bytes the numbers came from.

A prompt file is the test split when its name is ``test.jsonl`` (the world's splits, :mod:`vgrpo.world.prompts`) or
its bytes are those of a known test split (a renamed copy is still the test split).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from vgrpo.atomic import file_sha256

__all__ = [
    "TEST_SPLIT",
    "choice_record_problems",
    "is_test_split",
    "split_record",
    "tuning_prompt_problems",
]

TEST_SPLIT = "test.jsonl"
"""The file name of the split only a final report reads."""


def _digests(files: Iterable[str | Path]) -> set[str]:
    return {file_sha256(Path(f)) for f in files if Path(f).is_file()}


def _is_test(path: Path, test_digests: set[str]) -> bool:
    return path.name == TEST_SPLIT or (bool(test_digests) and path.is_file() and file_sha256(path) in test_digests)


def is_test_split(path: str | Path, known_test_files: Iterable[str | Path] = ()) -> bool:
    """Whether ``path`` is the test split: named ``test.jsonl``, or with the bytes of one of ``known_test_files``
    (those that exist)."""
    return _is_test(Path(path), _digests(known_test_files))


def tuning_prompt_problems(
    prompt_files: Mapping[str, str | Path], known_test_files: Iterable[str | Path] = (), *, final_report: str
) -> list[str]:
    """One problem per prompt file (keyed by what names it: a flag, a params key) that is the test split, for a
    command that tunes. ``final_report`` says how to read test instead (the command that may). The known test files
    are hashed once, and each distinct prompt file once (a curriculum's stages share theirs)."""
    test_digests = _digests(known_test_files)
    verdicts = {path: _is_test(path, test_digests) for path in {Path(p) for p in prompt_files.values()}}
    return [
        f"{field} {path}: the test split; recipe selection reads the validation split, and only the final report "
        f"reads test ({final_report})"
        for field, path in prompt_files.items()
        if verdicts[Path(path)]
    ]


def split_record(path: str | Path, role: str) -> dict[str, Any]:
    """What a record says about the prompts its numbers came from: ``role`` (``validation`` or ``test``), the file
    and its SHA-256."""
    return {"role": role, "prompt_file": str(path), "sha256": file_sha256(Path(path))}


def _record_split_file(record: Any) -> str | None:
    """The prompt file a choice record's numbers were read from: its ``split`` (:func:`split_record`, or the
    ``paired_gain`` table's ``{prompt_file, sha256}``) or, for an evaluation table, its ``prompt_file``."""
    if not isinstance(record, dict):
        return None
    if isinstance(record.get("split"), dict):
        return str(record["split"].get("prompt_file") or "") or None
    return str(record["prompt_file"]) if isinstance(record.get("prompt_file"), str) else None


def choice_record_problems(choices: Sequence[str | Path], *, field: str, root: str | Path = ".") -> list[str]:
    """Why a recipe whose settings cite ``choices`` (tuning records, paths relative to ``root``) may not have its
    final report: no choice on record, a record that is missing or not JSON, a record that does not say which
    prompts it read, or one that read the test split. Empty when every choice is on record on validation."""
    if not choices:
        return [f"{field}: empty; a final report needs the tuning records its recipe was chosen on"]
    problems: list[str] = []
    for choice in choices:
        path = Path(root) / choice
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError:
            problems.append(f"{field}: {choice}: no such record")
            continue
        except ValueError as err:
            problems.append(f"{field}: {choice}: not JSON ({err})")
            continue
        records = data if isinstance(data, list) else [data]
        files = [_record_split_file(r) for r in records]
        if not files or any(f is None for f in files):
            problems.append(f"{field}: {choice}: does not say which prompts its numbers read (no 'split')")
        elif any(Path(f).name == TEST_SPLIT for f in files if f):
            problems.append(f"{field}: {choice}: its numbers read the test split; re-choose on validation")
    return problems
