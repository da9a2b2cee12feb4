"""vgrpo: online RL for text-to-image flow-matching models with V-GRPO (arXiv 2604.23380)."""

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``from vgrpo import Trainer`` without importing torch and diffusers for ``import vgrpo``."""
    if name == "Trainer":
        from vgrpo.trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'vgrpo' has no attribute {name!r}")
