"""How a reward fails, and how a failure is told in one line: the error classes of the reward family, and what a
:class:`RewardFailed` message quotes of what a reward returned (:func:`describe_value`) or raised
(:func:`describe_raised`: the exception and the ``file:line`` in the user's own code), so a bug in a user's reward is
found without a traceback."""

from __future__ import annotations

import copy
import os
import reprlib
import sysconfig
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from vgrpo.errors import NonFiniteError, UserError

__all__ = [
    "NonFiniteRewardError",
    "RewardError",
    "RewardFailed",
    "TransientRewardError",
    "TransientRewardFailed",
    "describe_raised",
    "describe_value",
    "repr_of",
]


class RewardError(RuntimeError):
    """A reward returned something unusable (wrong shape, non-finite score) or its engine failed;
    the message names the reward."""


class TransientRewardError(RewardError):
    """A reward engine could not be reached or was overloaded (connection errors, timeouts, 429, 5xx) after its
    own retries: worth retrying later, unlike a refusal or a bad answer."""


class NonFiniteRewardError(RewardError, NonFiniteError):
    """A reward returned NaN or Inf scores: a training stage skips the iteration (:mod:`vgrpo.training.guards`).
    ``scores`` holds what it returned, for the event log."""

    scores: np.ndarray | None = None


def _restore_failure(cls: type[RewardFailed], message: str, state: dict[str, Any]) -> RewardFailed:
    failure = cls.__new__(cls)
    Exception.__init__(failure, message)
    failure.__dict__.update(state)
    return failure


class RewardFailed(UserError, RewardError):
    """One reward failed while scoring: it raised (anything but :class:`NonFiniteRewardError`), or returned something
    that is not ``N`` numbers (strings, ``None``, an object, the wrong count or shape).

    The message is one line: ``reward 'KEY' (IMPORT NAME) PROBLEM``, where the problem says what the reward returned
    (its type, a short repr and the ``(N,)`` numbers expected) or raised (the exception's type and message and the
    ``file:line`` it was raised at). The original exception, when there is one, is chained (``__cause__``).

    Attributes:
        reward: the reward's key in logs (:class:`vgrpo.rewards.multi.MultiReward`), or a bare reward's
            :attr:`Reward.name`.
        problem: what it returned or raised (``returned list ['a', 'b'], expected (2,) numbers``).
        source: its import name (``tests.rewards.custom:redness``), where known.
    """

    def __init__(self, reward: str, problem: str, source: str | None = None):
        self.reward, self.problem, self.source = reward, problem, source
        super().__init__(self.describe())

    def describe(self) -> str:
        """``reward 'KEY' (IMPORT NAME) PROBLEM``: the failure without a stage's context."""
        named = f"reward {self.reward!r}" + (f" ({self.source})" if self.source and self.source != self.reward else "")
        return f"{named} {self.problem}"

    def renamed(self, reward: str, source: str | None) -> RewardFailed:
        """The same failure (of the same class, with the same context) under the key ``reward`` and import name
        ``source``."""
        clone = copy.copy(self)
        clone.reward, clone.source = reward, source or self.source
        clone.args = (clone.describe(),)
        return clone

    def __reduce__(self) -> tuple[Any, ...]:  # picklable whatever a subclass's __init__ takes (Prefect results)
        return (_restore_failure, (type(self), str(self), dict(self.__dict__)))


class TransientRewardFailed(RewardFailed, TransientRewardError):
    """A reward's engine could not be reached after its retries (:class:`TransientRewardError`), named as a
    :class:`RewardFailed`: still worth a retry (the Prefect score phase retries it), one line when it is not."""


_LIBRARY_DIRS = tuple(
    os.path.join(Path(p).resolve(), "")  # with the separator: vgrpo/, not vgrpo_mine/
    for p in {
        *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
        str(Path(__file__).resolve().parents[1]),  # vgrpo itself
    }
)


def _is_library(filename: str) -> bool:
    try:
        resolved = str(Path(filename).resolve())
    except (OSError, RuntimeError):
        return False
    return resolved.startswith(_LIBRARY_DIRS) or filename.startswith("<")


def _short_path(filename: str) -> str:
    """``filename`` relative to the working directory when under it, as a user would open it."""
    try:
        return str(Path(filename).resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError, RuntimeError):
        return filename


def _one_line(text: str) -> str:
    return " / ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def describe_raised(exc: BaseException) -> str:
    """``raised TYPE: MESSAGE at FILE:LINE``: the innermost frame of ``exc``'s traceback, and the innermost frame of
    the user's own code too (``(from FILE:LINE)``) when the innermost one is in a library (numpy, the standard
    library, vgrpo)."""
    message = _one_line(str(exc))
    text = f"raised {type(exc).__name__}" + (f": {message}" if message else "")
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        inner = frames[-1]
        text += f" at {_short_path(inner.filename)}:{inner.lineno}"
        own = next((f for f in reversed(frames) if not _is_library(f.filename)), None)
        if own is not None and own is not inner:
            text += f" (from {_short_path(own.filename)}:{own.lineno})"
    return text


_REPR = reprlib.Repr()
_REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxdict = 6
_REPR.maxstring, _REPR.maxother = 40, 80
REPR_LIMIT = 80
"""Characters of a returned value's repr that a :class:`RewardFailed` message quotes."""


def repr_of(value: Any) -> str:
    """``value``'s repr on one line, cut to :data:`REPR_LIMIT` characters."""
    try:
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":  # its first and last entries, on one line
            short = np.array2string(value, threshold=6, edgeitems=3, precision=4, separator=", ", max_line_width=10**6)
            text = "array(" + " ".join(line.strip() for line in short.splitlines()) + ")"
        else:
            text = _one_line(_REPR.repr(value))
    except Exception as exc:  # a user's object whose __repr__ fails
        text = f"<unprintable: {type(exc).__name__}>"
    return text if len(text) <= REPR_LIMIT else text[: REPR_LIMIT - 3] + "..."


def describe_value(value: Any) -> str:
    """``TYPE REPR`` (:func:`repr_of`): what a reward returned, for a one-line message."""
    return f"{type(value).__name__} {repr_of(value)}"
