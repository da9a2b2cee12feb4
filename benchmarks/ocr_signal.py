"""How much an OCR group tells GRPO, against how much the reader alone moves: group-size-8 samples of the world's
OCR prompts from a pipeline (and LoRA), scored by the world OCR reward, then every image perturbed by one
intensity level per pixel (each pixel +1, 0 or -1 at random) and scored again.

    python -m benchmarks.ocr_signal models/embedded-base [--lora DIR] [--prompts data/world/test.jsonl]

Prints, as JSON:

* ``ocr`` (mean score) and ``exact`` (share read exactly);
* ``zero_variance_groups``, the share of prompts whose 8 samples all score the same (GRPO learns nothing there);
* ``within_group_std``, the mean over prompts of the scores' standard deviation within the group: the signal;
* the reader's noise floor: ``changed_by_one_level`` (the share of images whose score the perturbation changes)
  and ``noise_abs_change`` (the mean absolute change of a score under it);
* ``signal_to_noise``, ``within_group_std`` over the root-mean-square change.

The rollout sampler is the evaluation's Euler ODE at ``--steps`` (the stages' rollouts use 10), each sample's
noise from ``(seed, index)`` as in every evaluation, so two pipelines are compared on the same noise.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vgrpo.evaluation.evaluator import Sampling, generate
from vgrpo.models.pipeline import build_adapter, load_pipeline
from vgrpo.prompts import load_prompts
from vgrpo.rewards.config import RewardConfig
from vgrpo.rewards.multi import MultiReward
from vgrpo.world.quality import WORLD_OCR_REWARD, perturbed


def sample_rows(
    adapter: Any, policy: Any, rows: Sequence[dict[str, Any]], group: int, sampling: Sampling
) -> tuple[np.ndarray, list[str], list[dict[str, Any]]]:
    """``group`` images of each row's prompt (prompt-major) from ``policy``, sampled as an evaluation samples
    (each sample's noise from ``(sampling.seed, index)``), with each image's prompt and row."""
    prompts = [str(r["prompt"]) for r in rows for _ in range(group)]
    meta = [r for r in rows for _ in range(group)]
    with torch.no_grad():
        images, _ = generate(
            encode=adapter.encode_prompts,
            decode=adapter.decode_samples,
            policy=policy,
            prompts=prompts,
            latent_shape=adapter.latent_shape,
            sampling=sampling,
        )
    return images, prompts, meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pipeline")
    parser.add_argument("--lora", default=None)
    parser.add_argument("--prompts", default="data/world/test.jsonl")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [r for r in load_prompts(args.prompts) if r.get("tag") == "ocr"]
    pipe = load_pipeline(Path(args.pipeline))
    if args.lora:
        pipe.load_lora_weights(args.lora)
    adapter, policy = build_adapter(pipe)
    reward = MultiReward.from_configs([RewardConfig.model_validate(WORLD_OCR_REWARD)])
    images, prompts, meta = sample_rows(adapter, policy, rows, args.group, Sampling(args.steps, args.seed, None))
    clean = reward(images, prompts, meta).scores["ocr"]
    noisy = reward(perturbed(images, np.random.default_rng(args.seed)), prompts, meta).scores["ocr"]
    groups = clean.reshape(len(rows), args.group)
    change = noisy - clean
    within = float(groups.std(axis=1).mean())
    print(
        json.dumps(
            {
                "pipeline": args.pipeline,
                "lora": args.lora,
                "prompts": len(rows),
                "group": args.group,
                "steps": args.steps,
                "ocr": round(float(clean.mean()), 4),
                "exact": round(float((clean == 1.0).mean()), 4),
                "zero_variance_groups": round(float((groups.max(1) == groups.min(1)).mean()), 4),
                "within_group_std": round(within, 4),
                "changed_by_one_level": round(float((change != 0).mean()), 4),
                "noise_abs_change": round(float(np.abs(change).mean()), 4),
                "signal_to_noise": round(within / max(float(np.sqrt((change**2).mean())), 1e-9), 2),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
