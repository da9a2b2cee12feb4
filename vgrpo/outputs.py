"""Where a command writes, checked before any compute: an output never equals, contains or lies inside an input it
would replace, two outputs never collide, and every output's folder can be written.

An adapter, a merged pipeline or an export is published by renaming a finished temporary folder over its path
(:func:`vgrpo.atomic.atomic_dir`), which deletes what was there: ``--out`` pointing at the base pipeline would
replace it with a folder holding one LoRA file. Checkpoints are written under the work folder.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vgrpo.errors import UserError

__all__ = ["Output", "OutputError", "check_outputs", "output_problems", "writable_problem"]


class OutputError(UserError, ValueError):
    """An output path would overwrite an input or another output, or cannot be written; the message names both."""


@dataclass(frozen=True)
class Output:
    """A path a command writes.

    Attributes:
        label: how the user named it (``--out``, ``--work-dir``, ``out_dir``).
        path: the folder or file.
        replaced: written whole and renamed over ``path`` (an adapter, an export), so whatever ``path`` holds is
            deleted; otherwise written into (a work folder, a result file).
        is_file: a file (a result JSON, a grid PNG), not a folder.
    """

    label: str
    path: Path
    replaced: bool = True
    is_file: bool = False


def _relation(a: Path, b: Path) -> str | None:
    """How ``a`` sits against ``b``: ``is``, ``contains`` or ``inside``; None when apart."""
    if a == b:
        return "is"
    if a in b.parents:
        return "contains"
    if b in a.parents:
        return "inside"
    return None


def writable_problem(output: Output) -> str | None:
    """Why ``output`` cannot be written: it is a file where a folder goes (or the reverse), a file stands where a
    parent folder would be created, or its nearest existing folder refuses a new file (tried for real, so a
    read-only mount or a full quota is found now, not at the first checkpoint)."""
    path = Path(output.path)
    if path.exists() and path.is_dir() == output.is_file:
        found, wanted = ("folder", "file") if output.is_file else ("file", "folder")
        return f"{output.label} {path}: is a {found}, not a {wanted}"
    existing = path if path.exists() and not output.is_file else path.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{output.label} {path}: {existing} is a file, so the folder cannot be created"
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".vgrpo-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"{output.label} {path}: cannot write in {existing} ({exc.strerror or exc})"
    return None


def output_problems(outputs: Sequence[Output], inputs: Mapping[str, str | Path | None]) -> list[str]:
    """Every output that would overwrite or delete an input (``inputs``: label -> path; None entries are skipped),
    collide with another output, or cannot be written."""
    out: list[str] = []
    given = {label: Path(p).resolve() for label, p in inputs.items() if p is not None}
    for i, output in enumerate(outputs):
        mine = Path(output.path).resolve()
        for label, theirs in given.items():
            relation = _relation(mine, theirs)
            if relation == "is":
                out.append(f"{output.label} {output.path} is an input ({label}): writing it would replace it")
            elif relation == "contains" and output.replaced:
                out.append(
                    f"{output.label} {output.path} contains an input ({label}: {theirs}): writing it would delete it"
                )
            elif relation == "inside" and theirs.is_dir():
                out.append(f"{output.label} {output.path} lies inside an input ({label}: {theirs})")
        for other in outputs[i + 1 :]:
            relation = _relation(mine, Path(other.path).resolve())
            if (
                relation == "is"
                or (relation == "contains" and output.replaced)
                or (relation == "inside" and other.replaced)
            ):
                out.append(f"{output.label} {output.path} and {other.label} {other.path} overlap")
        problem = writable_problem(output)
        if problem:
            out.append(problem)
    return out


def check_outputs(outputs: Sequence[Output], inputs: Mapping[str, str | Path | None]) -> None:
    """:func:`output_problems`, raising one :class:`OutputError` that lists them."""
    problems = output_problems(outputs, inputs)
    if problems:
        raise OutputError(
            problems[0] if len(problems) == 1 else "\n".join(["outputs refused:", *(f"  - {p}" for p in problems)])
        )
