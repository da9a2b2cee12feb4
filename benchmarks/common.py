"""What the benchmark scripts share: the repository root, the methods compared, their labels and the GenEval tags."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

METHODS = ("vgrpo", "naive_elbo", "flow_grpo", "mixgrpo", "diffusion_nft")
"""The five methods of the comparison (``params/algorithms/<method>.yaml``), in the report's order."""

TIMED_METHODS = ("vgrpo", "flow_grpo", "mixgrpo")
"""The methods timed against the number of sampling steps."""

ARCH_METHODS = (*TIMED_METHODS, "diffusion_nft")
"""The methods timed at the SD3.5-M architecture (``benchmarks.sd35_arch`` and the GPU check)."""

LABELS = {
    "vgrpo": "V-GRPO",
    "naive_elbo": "naive ELBO-GRPO",
    "flow_grpo": "Flow-GRPO",
    "mixgrpo": "MixGRPO",
    "diffusion_nft": "DiffusionNFT",
}

GENEVAL_TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
"""The world's GenEval prompt tags (the preference stage adds ``ocr``)."""


def flags(**values: object) -> list[str]:
    """Command-line options from keywords: ``flags(text_tokens=77)`` is ``["--text-tokens", "77"]``."""
    return [arg for key, value in values.items() for arg in (f"--{key.replace('_', '-')}", str(value))]
