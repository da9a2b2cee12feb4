"""vgrpo: online RL for text-to-image flow-matching models with V-GRPO (arXiv 2604.23380).

The library logs through :mod:`logging` (the ``vgrpo`` logger and its children) and is silent by default, as a
library should be: configure logging (``logging.basicConfig(level=logging.INFO)``) to see its messages; the
``vgrpo`` command line does (``-v``/``-q``). ``Trainer(..., progress=True)`` shows a live progress line.
"""

import logging

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``from vgrpo import Trainer`` without importing torch and diffusers for ``import vgrpo``."""
    if name == "Trainer":
        from vgrpo.trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'vgrpo' has no attribute {name!r}")
