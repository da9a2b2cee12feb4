"""The bad-input error family: what the user can fix by changing an input (a params file or override, a prompt
file, a pipeline, adapter or model directory, a checkpoint on disk), named in the message.

The command lines print a :class:`UserError`'s message and exit with status 2; any other exception is a bug and
propagates with its traceback. Each subclass also keeps the builtin base its callers catch (``ValueError`` for
bad values, ``RuntimeError`` for a checkpoint).

Also here, so that the reward errors (:mod:`vgrpo.rewards.failures`) can subclass it without importing the training
loop: :class:`NonFiniteError`, a NaN or Inf the loop recovers from by skipping the iteration
(:mod:`vgrpo.training.guards`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["ConfigError", "NonFiniteError", "UserError", "read_user_text"]


class UserError(Exception):
    """Bad input; the message names the file, key or line and what was expected."""


class ConfigError(UserError, ValueError):
    """A params file or override is invalid; the message names the file and the key."""


class NonFiniteError(RuntimeError):
    """A quantity of one iteration is NaN or Inf.

    Attributes:
        quantity: what (``reward/pickscore``, ``advantages``, ``old_surrogates``, ``loss``, ``gradients``).
        details: JSON-able facts for the log: how many entries, which sample indices (first 16), the step.
    """

    def __init__(self, quantity: str, details: Mapping[str, Any], *, message: str | None = None):
        self.quantity = quantity
        self.details = dict(details)
        super().__init__(message or f"non-finite {quantity}: {self.details}")


def read_user_text(path: Path, what: str, max_bytes: int, error: type[UserError]) -> str:
    """A file the user named, read as UTF-8 text; ``error`` naming the file when it is missing, over ``max_bytes``
    (the limit in the message: read before anything parses it) or not UTF-8. ``what`` names it (``prompt file``)."""
    if not path.is_file():
        raise error(f"{path}: {what} not found")
    size = path.stat().st_size
    if size > max_bytes:
        raise error(f"{path}: {size} bytes is over the {max_bytes}-byte limit for a {what}")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text ({exc})") from exc
