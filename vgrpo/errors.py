"""The bad-input error family: what the user can fix by changing an input (a params file or override, a prompt
file, a pipeline, adapter or model directory, a checkpoint on disk), named in the message.

The command lines print a :class:`UserError`'s message and exit with status 2; any other exception is a bug and
propagates with its traceback. Each subclass also keeps the builtin base its callers catch (``ValueError`` for
bad values, ``RuntimeError`` for a checkpoint)."""

from __future__ import annotations

__all__ = ["ConfigError", "UserError"]


class UserError(Exception):
    """Bad input; the message names the file, key or line and what was expected."""


class ConfigError(UserError, ValueError):
    """A params file or override is invalid; the message names the file and the key."""
