"""Seeds derived from other seeds: every stream of randomness (an iteration's prompts and noise, an evaluation's
images, a rank's SDE noise) is a function of a few integers only, so runs and resumes repeat exactly."""

from __future__ import annotations

import numpy as np

__all__ = ["derive_seed"]


def derive_seed(*parts: int) -> int:
    """A non-negative 63-bit seed that depends on ``parts`` only (NumPy's ``SeedSequence``: well mixed, so nearby
    inputs give unrelated streams)."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1, dtype=np.uint64)[0] >> 1)
