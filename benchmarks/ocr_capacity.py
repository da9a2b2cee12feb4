"""Does LoRA rank cap OCR? A supervised check on ground-truth renders (the curriculum issue's item 4).

Each arm fine-tunes the base transformer by flow matching (SD3's loss, as in pretraining) on freshly rendered
ground-truth images of the train split's OCR prompts, the text encoders and the VAE frozen as in a stage: a LoRA
of each ``--ranks`` (the family's targets, alpha = 2 r as the stages' r 32 / alpha 64) and, with ``full``, every
transformer weight. Every ``--eval-every`` steps each arm samples the evaluation split's OCR prompts (the
evaluation's Euler ODE, each sample's noise from ``(--eval-seed, index)``, so every arm and step reads the same
noise) and scores them with the world OCR reward. Supervision on the right image is the easiest way to teach
spelling, so an arm's curve bounds what RL could reach with that adapter; if rank 32 tracks the full fine-tune, the
rank does not cap OCR.

    python -m benchmarks.ocr_capacity models/embedded-base --ranks 32 128 full --steps 1500 --eval-every 500 \
        --out metrics/tuning/ocr-capacity.json

Prints each evaluation as it lands and writes, as JSON, each arm's curve (step, mean OCR, share read exactly,
training loss over the last ``--eval-every`` steps, seconds) and, at every step, each LoRA arm minus the last arm
(paired by prompt, a 95% bootstrap interval over prompts).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.ocr_signal import sample_rows
from benchmarks.provenance import code_hash, cpu_model, git_state
from vgrpo.atomic import write_json_atomic
from vgrpo.evaluation.evaluator import Sampling
from vgrpo.evaluation.stats import bootstrap_ci
from vgrpo.images import images_to_tensor
from vgrpo.models.lora import add_lora
from vgrpo.models.pipeline import build_adapter, load_pipeline
from vgrpo.prompts import load_prompts
from vgrpo.rewards.config import RewardConfig
from vgrpo.rewards.multi import MultiReward
from vgrpo.splits import TEST_SPLIT, is_test_split, split_record
from vgrpo.world.prompts import scene_for
from vgrpo.world.quality import WORLD_OCR_REWARD
from vgrpo.world.render import render
from vgrpo.world.transformer_training import flow_matching_loss, logit_normal_timesteps

__all__ = ["paired_interval", "train_arm"]

Row = dict[str, Any]


def paired_interval(a: np.ndarray, b: np.ndarray, seed: int = 0, replicates: int = 10_000) -> list[float]:
    """Mean of ``a - b`` (per-prompt scores, paired) and its 95% percentile bootstrap interval over prompts."""
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    lo, hi = bootstrap_ci(diff, n_boot=replicates, seed=seed)
    return [round(float(diff.mean()), 4), round(lo, 4), round(hi, 4)]


def _ocr_scores(
    adapter: Any, policy: Any, reward: MultiReward, rows: Sequence[Row], group: int, sampling: Sampling
) -> np.ndarray:
    """Per-sample OCR scores ``(len(rows), group)``."""
    images, prompts, meta = sample_rows(adapter, policy, rows, group, sampling)
    scores = reward(images, prompts, meta).scores["ocr"]
    return np.asarray(scores, dtype=np.float64).reshape(len(rows), group)


def train_arm(
    pipeline: Path,
    arm: str,
    train_rows: Sequence[Row],
    eval_rows: Sequence[Row],
    args: argparse.Namespace,
    log: Any = print,
) -> dict[str, Any]:
    """One arm (``"full"`` or a LoRA rank as a string): its curve and each evaluation's per-prompt scores."""
    torch.manual_seed(args.seed)
    pipe = load_pipeline(pipeline)
    adapter, policy = build_adapter(pipe)
    transformer = pipe.transformer
    if arm == "full":
        transformer.requires_grad_(True)
    else:
        rank = int(arm)
        add_lora(transformer, rank=rank, alpha=2 * rank, target_modules=args.targets or type(adapter).lora_targets)
    params = [p for p in transformer.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.full_lr if arm == "full" else args.lr, weight_decay=0.0)
    # A linear warm-up: Adam's first steps at the full rate knock a pretrained model off what it can already do.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / args.warmup))
    reward = MultiReward.from_configs([RewardConfig.model_validate(WORLD_OCR_REWARD)])
    sampling = Sampling(args.eval_steps, args.eval_seed, None)
    rng = np.random.default_rng(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    resolution = int(adapter.resolution)
    curve: list[dict[str, Any]] = []
    per_prompt: dict[int, list[float]] = {}
    losses: list[float] = []
    t0 = time.perf_counter()

    def evaluate_at(step: int) -> None:
        transformer.eval()
        scores = _ocr_scores(adapter, policy, reward, eval_rows, args.eval_group, sampling)
        transformer.train()
        per_prompt[step] = [round(float(v), 6) for v in scores.mean(axis=1)]
        point = {
            "step": step,
            "ocr": round(float(scores.mean()), 4),
            "exact": round(float((scores == 1.0).mean()), 4),
            "loss": round(float(np.mean(losses)), 5) if losses else None,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        curve.append(point)
        losses.clear()
        log(json.dumps({"arm": arm, **point}))

    evaluate_at(0)
    for step in range(1, args.steps + 1):
        batch = [train_rows[int(i)] for i in rng.integers(0, len(train_rows), size=args.batch)]
        images = np.stack([render(scene_for(r, rng), resolution) for r in batch])
        with torch.no_grad():
            x0 = adapter.encode_images(images_to_tensor(images), generator=generator)
            cond = adapter.encode_prompts([str(r["prompt"]) for r in batch])
        t = logit_normal_timesteps(len(batch), 0.0, 1.0, generator)
        eps = torch.randn(x0.shape, generator=generator)
        loss = flow_matching_loss(policy, x0, cond, t, eps)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        losses.append(float(loss.item()))
        if step % args.eval_every == 0 or step == args.steps:
            evaluate_at(step)
    trained = sum(p.numel() for p in params)
    return {"arm": arm, "trained_parameters": trained, "curve": curve, "per_prompt": per_prompt}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pipeline", type=Path)
    parser.add_argument("--ranks", nargs="+", default=["32", "128", "full"], help="LoRA ranks, and/or full")
    parser.add_argument("--targets", nargs="+", default=None, help="LoRA target modules (default: the family's)")
    parser.add_argument("--train-prompts", default="data/world/train.jsonl")
    parser.add_argument("--eval-prompts", default="data/world/validation.jsonl")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3, help="the LoRA arms' rate")
    parser.add_argument(
        "--full-lr",
        type=float,
        default=5e-4,
        help="the full fine-tune's (the pretraining schedule's at the release step)",
    )
    parser.add_argument("--warmup", type=int, default=100, help="steps of linear warm-up")
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--eval-group", type=int, default=4)
    parser.add_argument("--eval-steps", type=int, default=20)
    parser.add_argument("--eval-seed", type=int, default=1, help="the validation overlay's noise seed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    for arm in args.ranks:
        if arm != "full" and not (arm.isdigit() and int(arm) > 0):
            parser.error(f"--ranks: {arm!r} is neither a positive rank nor 'full'")
    if is_test_split(args.eval_prompts, [Path(args.train_prompts).parent / TEST_SPLIT]):
        parser.error("--eval-prompts: the test split is read by final reports only; use the validation split")
    for flag in ("train_prompts", "eval_prompts"):
        if not Path(getattr(args, flag)).is_file():
            parser.error(f"--{flag.replace('_', '-')}: {getattr(args, flag)} does not exist")
    torch.set_num_threads(args.threads)
    train_rows = [r for r in load_prompts(args.train_prompts) if r.get("tag") == "ocr"]
    eval_rows = [r for r in load_prompts(args.eval_prompts) if r.get("tag") == "ocr"]
    if not train_rows or not eval_rows:
        parser.error("no OCR prompts in --train-prompts or --eval-prompts")
    arms = [train_arm(args.pipeline, arm, train_rows, eval_rows, args) for arm in args.ranks]
    reference = arms[-1]
    for arm in arms[:-1]:
        arm["minus_" + reference["arm"]] = {
            step: paired_interval(np.array(arm["per_prompt"][step]), np.array(reference["per_prompt"][step]))
            for step in arm["per_prompt"]
        }
    record = {
        "command": "python -m benchmarks.ocr_capacity " + " ".join(argv if argv is not None else sys.argv[1:]),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "cpu": cpu_model(),
        "threads": args.threads,
        "code_hash": code_hash(),
        "git": git_state(),
        "eval_prompts": len(eval_rows),
        "split": split_record(args.eval_prompts, "validation"),
        "arms": arms,
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(args.out, record)
    for arm in arms[:-1]:
        print(arm["arm"], "minus", reference["arm"], json.dumps(arm["minus_" + reference["arm"]]))


if __name__ == "__main__":
    main()
