"""A reward function for tests of concurrent training: zeros, scored only once every party is training.

The first time a process scores, it leaves a marker in ``folder`` and waits until ``parties`` processes have left
theirs; later calls find them all and return at once. Two ablation cells that use it can therefore only finish
if they train at the same time: run one after the other, the first one's wait ends in a ``TimeoutError`` that
names the folder and how many arrived. A constant reward leaves every group's advantages unchanged.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def rendezvous(
    images: list[Any],
    prompts: list[str],
    metadata: list[Any],
    *,
    folder: str | None = None,
    parties: int = 2,
    timeout_s: float = 300,
) -> list[float]:
    """Zeros for ``images`` once ``parties`` processes have scored with the same ``folder`` (an option the params
    must give: a reward function's options need defaults to pass the registry's signature check)."""
    if folder is None:
        raise ValueError("rendezvous: give the option 'folder'")
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{os.getpid()}.arrived").touch()
    deadline = time.monotonic() + timeout_s
    while (arrived := len(list(path.glob("*.arrived")))) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"rendezvous {folder}: {arrived} of {parties} processes arrived in {timeout_s} s")
        time.sleep(0.2)
    return [0.0] * len(images)
