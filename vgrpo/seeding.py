"""Seeds derived from other seeds: every stream of randomness (an iteration's prompts and noise, an evaluation's
images, a rank's SDE noise) is a function of a few integers only, so runs and resumes repeat exactly."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["derive_seed", "sample_noise"]


def derive_seed(*parts: int) -> int:
    """A non-negative 63-bit seed that depends on ``parts`` only (NumPy's ``SeedSequence``: well mixed, so nearby
    inputs give unrelated streams)."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1, dtype=np.uint64)[0] >> 1)


def sample_noise(seed: int, indices: Sequence[int], latent_shape: Sequence[int]) -> Tensor:
    """``(len(indices), *latent_shape)`` standard normal noise, row ``k`` a function of ``(seed, indices[k])``."""
    rows = []
    for i in indices:
        state = derive_seed(seed, i)
        rows.append(torch.randn(*latent_shape, generator=torch.Generator().manual_seed(state)))
    return torch.stack(rows)
