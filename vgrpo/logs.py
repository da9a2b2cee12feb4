"""The library's logging: module loggers under ``vgrpo`` (:func:`get_logger`), silent unless the application
configures logging, as a library should be (a :class:`logging.NullHandler` on the ``vgrpo`` logger, so Python's
last-resort handler prints nothing either). ``logging.basicConfig(level=logging.INFO)`` shows them; the ``vgrpo``
command line does (``-v``/``-q``). The live progress line is :class:`vgrpo.training.stage.ProgressView`
(``Trainer(..., progress=True)``), not a log.

The handler is added here rather than in ``vgrpo/__init__.py``: that file is a code dependency of the DVC stages that
build the embedded world, whose outputs a change there would mark stale.
"""

from __future__ import annotations

import logging

__all__ = ["get_logger"]

_ROOT = logging.getLogger("vgrpo")
if not any(isinstance(handler, logging.NullHandler) for handler in _ROOT.handlers):
    _ROOT.addHandler(logging.NullHandler())


def get_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` for a module of the library (``name`` is its ``__name__``)."""
    return logging.getLogger(name)
