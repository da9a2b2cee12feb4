"""What a ``module:attribute`` string names: how a user points the registries (rewards, model families) at code of
their own. One implementation, so every registry refuses a bad target with the same reasons."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ImportTargetError", "first_line", "import_target"]


class ImportTargetError(Exception):
    """Why a ``module:attribute`` target cannot be imported; each registry re-raises it as its own error."""


def first_line(exc: BaseException) -> str:
    """``Type: message`` of an exception, its message cut to the first line; a SyntaxError's file and line."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"SyntaxError: {exc.msg} ({exc.filename}, line {exc.lineno})"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def import_target(target: str) -> Any:
    """The object ``module:attribute`` names (``attribute`` may be dotted: ``module:Class.method``).

    Raises:
        ImportTargetError: the module cannot be imported (its own code ran, so any error is the user's: a
            SyntaxError, a NameError), or it has no such attribute.
    """
    module, _, attribute = target.partition(":")
    try:
        found: Any = importlib.import_module(module)
    except Exception as exc:
        raise ImportTargetError(f"cannot import module {module!r}: {first_line(exc)}") from exc
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ImportTargetError(f"module {module!r} has no attribute {attribute!r}")
        found = getattr(found, part)
    return found
