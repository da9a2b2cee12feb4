"""vgrpo: online RL for text-to-image flow-matching models with V-GRPO (arXiv 2604.23380)."""

__version__ = "0.1.0"
