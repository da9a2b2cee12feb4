"""How much disk a stage's checkpoints take, reckoned from the transformer's safetensors headers before any weights
load, and whether the checkpoint folder's disk holds them (a preflight check: :mod:`vgrpo.training.preflight`)."""

from __future__ import annotations

import math
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from vgrpo.checkpoints.weight_files import transformer_shapes
from vgrpo.config import StageConfig
from vgrpo.models.folder import folder_lora_targets

__all__ = ["checkpoint_estimate", "disk_problem"]


def _snapshots(config: StageConfig) -> int:
    """Weight copies a checkpoint saves besides the policy: the algorithm's (its KL reference, DiffusionNFT's old
    policy: :meth:`vgrpo.algorithms.config.AlgorithmOptions.weight_copies`) and the EMA's."""
    return int(config.ema.enabled) + config.algorithm.weight_copies()


def checkpoint_estimate(
    config: StageConfig, pipeline: Path, shapes: dict[str, list[int]] | None = None
) -> tuple[int, str] | None:
    """Bytes a stage's checkpoints and export take, and how that was reckoned, from the shapes in the transformer's
    safetensors headers (``shapes`` when the caller read them: :func:`transformer_shapes`); None when they cannot
    be read."""
    shapes = shapes if shapes is not None else transformer_shapes(pipeline)
    if shapes is None:
        return None
    if config.lora is None:
        params = sum(math.prod(s) for s in shapes.values())
    else:
        targets = folder_lora_targets(config.lora, pipeline)
        params = sum(
            config.lora.rank * (s[0] + s[1])
            for name, s in shapes.items()
            if len(s) == 2 and any(name.removesuffix(".weight").endswith(f".{t}") for t in targets)
        )
    snapshots, kept = _snapshots(config), config.keep_checkpoints + 1
    total = 4 * params * ((3 + snapshots) * kept + 1)
    how = (
        f"{config.name}: {params:,} trainable fp32 parameters x 4 bytes x (1 weights + 2 Adam moments + "
        f"{snapshots} snapshots) x {kept} checkpoints (keep_checkpoints + one being written), "
        "+ the export"
    )
    return total, how


def disk_problem(
    stages: Sequence[StageConfig], root: Path, checkpoint_dir: Path, shapes: Mapping[str, dict[str, list[int]] | None]
) -> str | None:
    """The checkpoint folder's disk against the sum of every stage's :func:`checkpoint_estimate`; None when it holds
    them."""
    estimates = [
        e for cfg in stages if (e := checkpoint_estimate(cfg, root / cfg.pipeline, shapes[cfg.pipeline])) is not None
    ]
    need = sum(total for total, _ in estimates)
    existing = Path(checkpoint_dir)
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if need <= free:
        return None
    return (
        f"{checkpoint_dir}: {free / 1e9:.2f} GB free on its disk, but the checkpoints need about {need / 1e9:.2f} "
        f"GB ({'; '.join(how for _, how in estimates)})"
    )
