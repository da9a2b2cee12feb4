"""The embedded world's learned reward models as the DVC stages ``world_clip`` and ``world_pickscore`` make them:
trained, evaluated on held-out data (:mod:`vgrpo.world.reward_eval`), and saved with their config and metrics in
``world_reward_model.json``."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import CLIPModel

from vgrpo.atomic import dir_size_mb
from vgrpo.errors import UserError
from vgrpo.world.clip import TrainedRewardModel, final_metrics, save_reward_model, train_world_clip
from vgrpo.world.config import WorldCLIPConfig, WorldPreferenceConfig
from vgrpo.world.preference import evaluation_pairs, train_world_preference
from vgrpo.world.prompts import read_split
from vgrpo.world.reward_eval import evaluate_clip, evaluate_preference, preference_records

__all__ = ["CLIP_FILES", "make_world_clip", "make_world_pickscore"]

CLIP_FILES = ("config.json", "model.safetensors", "vocab.json", "preprocessor_config.json")
"""What a world CLIP directory must hold to start the preference model from."""

Log = Callable[[str], None]


def make_world_clip(
    config: WorldCLIPConfig, test_split: str | Path, out_dir: str | Path, *, log: Log = print
) -> dict[str, Any]:
    """Train the world CLIP, evaluate it on the ground-truth renders of ``test_split`` (a world split file) and
    ``config.eval_preference_prompts`` preference captions, and save it to ``out_dir``; returns its metrics."""
    records = read_split(test_split) + preference_records(config.eval_seed, config.eval_preference_prompts)
    t0 = time.perf_counter()
    trained = train_world_clip(config, log=log)
    train_s = time.perf_counter() - t0
    metrics = evaluate_clip(
        trained.model,
        trained.tokenizer,
        records,
        mean=config.image_mean,
        std=config.image_std,
        size=config.image_size,
        seed=config.eval_seed,
        negatives=config.eval_negatives,
        batch=config.eval_batch,
    )
    metrics |= {"train_s": train_s, "final_train": final_metrics(trained.history), "eval_prompts": str(test_split)}
    metrics["parameters"] = sum(p.numel() for p in trained.model.parameters())
    return _save(out_dir, trained, config, metrics)


def make_world_pickscore(
    config: WorldPreferenceConfig, clip_dir: str | Path, out_dir: str | Path, *, log: Log = print
) -> dict[str, Any]:
    """Fine-tune the world CLIP in ``clip_dir`` into the world PickScore model, evaluate it and the CLIP it
    started from on held-out (clean, degraded) pairs, and save it to ``out_dir``; returns its metrics."""

    clip_dir = Path(clip_dir)
    for name in CLIP_FILES:
        if not (clip_dir / name).is_file():
            raise UserError(f"{clip_dir}: not a world CLIP directory ({name} missing; run train-world-clip)")
    t0 = time.perf_counter()
    trained = train_world_preference(config, clip_dir, log=log)
    train_s = time.perf_counter() - t0
    pairs = evaluation_pairs(config, int(trained.processor.crop_size["height"]))
    stats = {"mean": tuple(trained.processor.image_mean), "std": tuple(trained.processor.image_std)}
    metrics = evaluate_preference(trained.model, trained.tokenizer, pairs, **stats)
    initial = CLIPModel.from_pretrained(clip_dir, use_safetensors=True).eval()
    metrics |= {
        "init_clip": evaluate_preference(initial, trained.tokenizer, pairs, **stats),
        "train_s": train_s,
        "final_train": final_metrics(trained.history),
        "clip": str(clip_dir),
    }
    return _save(out_dir, trained, config, metrics)


def _save(
    out_dir: str | Path,
    trained: TrainedRewardModel,
    config: WorldCLIPConfig | WorldPreferenceConfig,
    metrics: dict[str, Any],
) -> dict[str, Any]:
    """Save the model with its config and ``metrics``; returns ``metrics`` plus the directory's size."""
    out = save_reward_model(out_dir, trained, {"config": config.model_dump(mode="json"), "metrics": metrics})
    return metrics | {"dir_mb": dir_size_mb(out)}
