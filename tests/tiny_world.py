"""A tiny project on disk for stage and flow tests: world prompt files and a tiny embedded pipeline."""

from __future__ import annotations

from pathlib import Path

from .models.test_embedded import TINY

WORLD_PICK = Path(__file__).parents[1] / "models" / "world-pickscore"
"""The shipped world PickScore: a dense reward, so that groups vary and adapters move."""

TINY_MODEL_PARAMS = {
    "pipeline": "base", "eval_prompts": "test.jsonl",
    "rollout": {"prompts_per_iteration": 2, "group_size": 4, "num_steps": 4, "shift": None},
    "lora": {"rank": 4, "alpha": 8, "target_modules": ["to_q", "to_k", "to_v", "to_out.0"]},
    "evaluation": {"group_size": 1, "num_steps": 2, "rewards": [{"name": "geneval"}]},
}  # fmt: skip
"""A model params file for :func:`write_tiny_world`'s pipeline: stages of seconds."""


def write_tiny_world(root: Path, n_train: int = 40, n_test: int = 8) -> Path:
    """``root/train.jsonl``, ``root/test.jsonl`` and ``root/base`` (a 16 px embedded pipeline); returns root."""
    from vgrpo.models.embedded import build_pipeline, train_clip_tokenizer
    from vgrpo.world import make_splits, write_jsonl

    train, test = make_splits(0, n_train, n_test)
    write_jsonl(root / "train.jsonl", [md for md, _ in train])
    write_jsonl(root / "test.jsonl", [md for md, _ in test])
    prompts = [md["prompt"] for md, _ in train + test] + [""]
    build_pipeline(TINY, train_clip_tokenizer(prompts, TINY), seed=0).save_pretrained(root / "base")
    return root
