"""Reward throughput on this machine: images per second of each world reward, and rollout + scoring with and
without scoring on the background thread.

    python -m benchmarks.rewards [--images 192] [--prompts data/world/test.jsonl] [--threads 2]

Images are ground-truth renders of seeded world prompts (GenEval tags and OCR), so every reward has work to
do (text to read, objects to detect). Three OCR readers are timed: Flow-GRPO's setting (PP-OCR's detector and
recogniser on the whole image, ``ocr``), a smaller detector input (``ocr_det256``) and the world's reward, the
recogniser alone on the known text band (``ocr_line``, what the embedded params use). The learned world
rewards are included when their DVC stages have been reproduced (models/world-clip, models/world-pickscore).
The overlap part samples the shipped base model (20 Euler steps) in chunks and scores each chunk either after
all sampling or while the next chunk samples. The agreement part compares ``ocr_line`` with ``ocr`` on the
base model's own samples of the OCR test prompts.
Prints a table; run nothing else alongside a timing.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from benchmarks.common import ROOT
from vgrpo.evaluation.evaluator import Sampling, evaluate, generate
from vgrpo.images import tensor_to_images
from vgrpo.models.pipeline import load_sd3_pipeline
from vgrpo.models.sd3 import SD3Adapter, SD3Velocity
from vgrpo.rewards.config import RewardConfig
from vgrpo.rewards.multi import MultiReward
from vgrpo.rewards.ocr import OCRReward
from vgrpo.world import make_splits, read_jsonl, render

LINE_BOX = (0.0, 0.72, 1.0, 1.0)
"""The world's text band, as in params/embedded/evaluate.yaml."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=192)
    parser.add_argument("--prompts", default=str(ROOT / "data/world/test.jsonl"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="best of this many timed passes")
    parser.add_argument("--overlap-prompts", type=int, default=48, help="prompts x 4 samples for the overlap part")
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=("throughput", "overlap", "agreement"),
        default=["throughput", "overlap", "agreement"],
        help="which parts to run",
    )
    parser.add_argument("--agreement-prompts", type=int, default=40, help="OCR test prompts x 4 for the agreement")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    records = make_splits(
        0, 1, args.images, tags=("single_object", "two_object", "counting", "colors", "position", "color_attr", "ocr")
    )[1]
    metadata = [md for md, _ in records]
    images = np.stack([render(scene) for _, scene in records])
    prompts = [md["prompt"] for md in metadata]
    fast_ocr = {"engine_options": {"det_limit_type": "min", "det_limit_side_len": 256}}
    specs = [
        {"name": "geneval"},
        {"name": "ocr"},
        {"name": "ocr", "key": "ocr_det256", "options": fast_ocr},
        {"name": "ocr", "key": "ocr_line", "options": {"line_box": list(LINE_BOX)}},
        {
            "name": "ocr",
            "key": "ocr_line_w192",
            "options": {"line_box": list(LINE_BOX), "engine_options": {"width": 192}},
        },
    ]
    for key, name, path in (
        ("world_clip", "clipscore", "models/world-clip"),
        ("world_pickscore", "pickscore", "models/world-pickscore"),
    ):
        if (ROOT / path).is_dir():
            specs.append({"name": name, "key": key, "options": {"path": str(ROOT / path), "device": "cpu"}})
    rewards = MultiReward.from_configs([RewardConfig.model_validate(s) for s in specs])
    rows = []
    for key, term in rewards.terms.items():
        mask = [term.applies_to(p, md) for p, md in zip(prompts, metadata, strict=True)]
        idx = [i for i, m in enumerate(mask) if m]
        sub_images, sub_prompts, sub_md = images[idx], [prompts[i] for i in idx], [metadata[i] for i in idx]
        term.reward(sub_images[:2], sub_prompts[:2], sub_md[:2])  # warm-up (engine start, caches)
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            term.reward(sub_images, sub_prompts, sub_md)
            best = min(best, time.perf_counter() - t0)
        rows.append({"reward": key, "images": len(idx), "seconds": best, "images_per_s": len(idx) / best})
    print(f"{'reward':<18}{'images':>8}{'seconds':>10}{'images/s':>10}")
    for r in rows:
        print(f"{r['reward']:<18}{r['images']:>8}{r['seconds']:>10.2f}{r['images_per_s']:>10.1f}")

    out: dict[str, object] = {"throughput": rows}
    if "overlap" in args.parts:
        out["overlap"] = _overlap(rewards, args)
    if "agreement" in args.parts:
        out["ocr_agreement"] = _agreement(args)
    print(json.dumps(out, indent=2))
    rewards.close()


def _agreement(args: argparse.Namespace) -> dict[str, float]:
    """The world OCR reward (recogniser on the text band) against Flow-GRPO's (detector + recogniser) on the
    base model's samples of the first ``--agreement-prompts`` OCR test prompts (4 each, 20 Euler steps, seed 0)."""
    pipe = load_sd3_pipeline(ROOT / "models/embedded-base")
    adapter, policy = SD3Adapter(pipe), SD3Velocity(pipe.transformer.eval())
    rows = [r for r in read_jsonl(args.prompts) if r["tag"] == "ocr"][: args.agreement_prompts]
    prompts = [str(r["prompt"]) for r in rows for _ in range(4)]
    images, _ = generate(
        encode=adapter.encode_prompts,
        decode=lambda z: tensor_to_images(adapter.decode(z)),
        policy=policy,
        prompts=prompts,
        latent_shape=adapter.latent_shape,
        sampling=Sampling(20, 0, float(pipe.scheduler.config.shift)),
    )
    full = OCRReward()(images, prompts).scores
    line = OCRReward(line_box=LINE_BOX)(images, prompts).scores
    return {
        "images": float(len(prompts)),
        "ocr_mean": float(full.mean()),
        "ocr_line_mean": float(line.mean()),
        "same_score_frac": float(np.mean(np.isclose(full, line))),
        "mean_abs_diff": float(np.abs(full - line).mean()),
    }


def _overlap(rewards: object, args: argparse.Namespace) -> dict[str, float]:
    """Sampling + scoring wall time of the shipped base with scoring after sampling vs on the reward thread."""
    base = ROOT / "models/embedded-base"
    metadata = read_jsonl(args.prompts)[: args.overlap_prompts]
    pipe = load_sd3_pipeline(base)
    adapter, policy = SD3Adapter(pipe), SD3Velocity(pipe.transformer.eval())
    out: dict[str, float] = {}
    for overlap in (False, True):
        table, _ = evaluate(
            adapter=adapter,
            policy=policy,
            metadata=metadata,
            rewards=rewards,  # type: ignore[arg-type]
            group_size=4,
            sampling=Sampling(20, 0, float(pipe.scheduler.config.shift)),
            micro_batch=32,
            overlap=overlap,
        )
        out[f"{'overlapped' if overlap else 'sequential'}_total_s"] = table["seconds"]["total"]
        out[f"{'overlapped' if overlap else 'sequential'}_sampling_s"] = table["seconds"]["sampling"]
    out["samples"] = float(len(metadata) * 4)
    return out


if __name__ == "__main__":
    main()
