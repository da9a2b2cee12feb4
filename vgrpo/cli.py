"""Command line for the embedded world and base model.

    python -m vgrpo.cli world-splits --params params/embedded/pretrain.yaml --out data/world
    python -m vgrpo.cli pretrain --params params/embedded/pretrain.yaml --splits data/world --out models/embedded-base
    python -m vgrpo.cli evaluate models/embedded-base --prompts data/world/test.jsonl --out metrics/base_eval.json
    python -m vgrpo.cli train-world-clip --params params/embedded/rewards.yaml --splits data/world --out DIR
    python -m vgrpo.cli train-world-preference --params params/embedded/rewards.yaml --clip DIR --out DIR2

``--set key.sub=value`` overrides an entry of the params section (``steps=20``, ``vae.steps=10``; the value is
parsed as YAML). Errors in params, prompt files or pipeline directories exit with status 2 and one message
naming the file and the key.
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
import yaml

from vgrpo.config import ConfigError, PretrainConfig, load_config

__all__ = ["main"]


def _overrides(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {pair!r}: expected key.sub=value")
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = yaml.safe_load(raw)
    return out


def _pretrain_config(args: argparse.Namespace) -> PretrainConfig:
    return load_config(args.params, _overrides(args.set), section="pretrain", schema=PretrainConfig)


def cmd_world_splits(args: argparse.Namespace) -> None:
    from vgrpo.world import make_splits, scene_to_dict, write_jsonl

    cfg = _pretrain_config(args)
    train, test = make_splits(
        cfg.seed, cfg.train_prompts, cfg.test_prompts, held_out_pairs=cfg.held_out_pairs, tags=cfg.split_tags
    )
    out = Path(args.out)
    for name, records in (("train", train), ("test", test)):
        write_jsonl(out / f"{name}.jsonl", ({**md, "scene": scene_to_dict(sc)} for md, sc in records))
    print(f"wrote {len(train)} train and {len(test)} test prompts to {out}")


def _read_metadata(path: str | Path) -> list[dict[str, Any]]:
    from vgrpo.world.prompts import read_jsonl

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: prompt file not found")
    records = read_jsonl(p)
    if not records:
        raise ConfigError(f"{p}: prompt file is empty")
    for i, rec in enumerate(records, 1):
        if "prompt" not in rec or "tag" not in rec:
            raise ConfigError(f"{p}:{i}: a metadata line needs 'tag' and 'prompt'")
    return records


def _sampler(adapter: Any, velocity: Any, num_steps: int, seed: int, shift: float | None) -> Any:
    import torch

    from vgrpo.pretrain import sample_images

    def sample(prompts: list[str]) -> np.ndarray:
        return sample_images(adapter, velocity, prompts, num_steps, torch.Generator().manual_seed(seed), shift=shift)

    return sample


def cmd_pretrain(args: argparse.Namespace) -> None:
    import torch

    from vgrpo.pretrain import pretrain
    from vgrpo.rewards.ocr import RapidOCRReader
    from vgrpo.world.evaluate import evaluate_world, write_json_atomic

    cfg = _pretrain_config(args)
    torch.set_num_threads(args.threads)
    eval_md = _read_metadata(Path(args.splits) / "test.jsonl")[: cfg.eval_prompts]
    ocr = RapidOCRReader() if any(md["tag"] == "ocr" for md in eval_md) else None

    def evaluate(adapter: Any, velocity: Any, step: int) -> dict[str, float]:
        sample = _sampler(adapter, velocity, cfg.sample_steps, cfg.seed, cfg.model.scheduler_shift)
        summary, _ = evaluate_world(sample, eval_md, group_size=cfg.eval_group, ocr=ocr)
        keys = ("geneval_strict", "geneval_partial", "varied_group_frac", "ocr")
        return {k: float(summary[k]) for k in keys if k in summary}

    t0 = time.perf_counter()
    final = pretrain(cfg, args.work, args.out, evaluate=evaluate)
    print(f"pipeline written to {final} in {time.perf_counter() - t0:.0f} s")
    if args.metrics:
        import resource

        history = (final / "pretrain_history.json").read_text()
        write_json_atomic(
            args.metrics,
            {
                "wall_s": time.perf_counter() - t0,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "final": json.loads(history)[-1] if json.loads(history) else {},
            },
        )


def cmd_evaluate(args: argparse.Namespace) -> None:
    import torch

    from vgrpo.models.pipeline import SD3Adapter, load_sd3_pipeline
    from vgrpo.models.sd3 import SD3Velocity
    from vgrpo.rewards.ocr import RapidOCRReader
    from vgrpo.world.evaluate import evaluate_world, write_json_atomic

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    metadata = _read_metadata(args.prompts)
    if args.limit:
        metadata = metadata[: args.limit]
    pipe = load_sd3_pipeline(args.pipeline)
    adapter = SD3Adapter(pipe)
    shift = float(pipe.scheduler.config.shift)
    ocr = RapidOCRReader() if any(md["tag"] == "ocr" for md in metadata) else None
    t0 = time.perf_counter()
    sample = _sampler(adapter, SD3Velocity(pipe.transformer.eval()), args.steps, args.seed, shift)
    summary, images = evaluate_world(sample, metadata, group_size=args.group_size, ocr=ocr)
    summary |= {"pipeline": str(args.pipeline), "steps": args.steps, "seed": args.seed}
    summary["wall_s"] = time.perf_counter() - t0
    write_json_atomic(args.out, summary)
    if args.grid:
        _write_grid(args.grid, images[: 8 * args.group_size], args.group_size)
    _print_table(summary)


def _dir_size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def cmd_train_world_clip(args: argparse.Namespace) -> None:
    import torch

    from vgrpo.config import WorldCLIPConfig
    from vgrpo.rewards.world_eval import evaluate_clip, preference_records
    from vgrpo.rewards.world_models import final_metrics, save_reward_model, train_world_clip
    from vgrpo.world.evaluate import write_json_atomic
    from vgrpo.world.prompts import scene_from_dict

    cfg = load_config(args.params, _overrides(args.set), section="world_clip", schema=WorldCLIPConfig)
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    test_path = Path(args.splits) / "test.jsonl"
    metadata = _read_metadata(test_path)
    for i, md in enumerate(metadata, 1):
        if "scene" not in md:
            raise ConfigError(f"{test_path}:{i}: a test record needs its ground-truth 'scene'")
    records = [(md, scene_from_dict(md["scene"])) for md in metadata]
    records += preference_records(cfg.eval_seed, cfg.eval_preference_prompts)
    t0 = time.perf_counter()
    trained = train_world_clip(cfg, log=print)
    train_s = time.perf_counter() - t0
    metrics = evaluate_clip(
        trained.model,
        trained.tokenizer,
        records,
        mean=cfg.image_mean,
        std=cfg.image_std,
        size=cfg.image_size,
        seed=cfg.eval_seed,
        negatives=cfg.eval_negatives,
        batch=cfg.eval_batch,
    )
    metrics |= {"train_s": train_s, "final_train": final_metrics(trained.history), "eval_prompts": str(test_path)}
    metrics["parameters"] = sum(p.numel() for p in trained.model.parameters())
    out = save_reward_model(args.out, trained, {"config": cfg.model_dump(mode="json"), "metrics": metrics})
    metrics["dir_mb"] = _dir_size_mb(out)
    print(
        f"world CLIP written to {out} ({metrics['dir_mb']:.2f} MB) in {train_s:.0f} s: retrieval "
        f"{metrics['retrieval_acc']:.3f} (chance {metrics['retrieval_chance']:.3f}), in-batch i2t "
        f"{metrics['in_batch_i2t_top1']:.3f}"
    )
    if args.metrics:
        write_json_atomic(args.metrics, metrics)


def cmd_train_world_preference(args: argparse.Namespace) -> None:
    import torch

    from vgrpo.config import WorldPreferenceConfig
    from vgrpo.rewards.world_eval import evaluate_preference
    from vgrpo.rewards.world_models import final_metrics, save_reward_model
    from vgrpo.rewards.world_preference import evaluation_pairs, train_world_preference
    from vgrpo.world.evaluate import write_json_atomic

    cfg = load_config(args.params, _overrides(args.set), section="world_pickscore", schema=WorldPreferenceConfig)
    clip_dir = Path(args.clip)
    for name in ("config.json", "model.safetensors", "vocab.json", "preprocessor_config.json"):
        if not (clip_dir / name).is_file():
            raise ConfigError(f"{clip_dir}: not a world CLIP directory ({name} missing; run train-world-clip)")
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    t0 = time.perf_counter()
    trained = train_world_preference(cfg, clip_dir, log=print)
    train_s = time.perf_counter() - t0
    pairs = evaluation_pairs(cfg, int(trained.processor.crop_size["height"]))
    stats = {"mean": tuple(trained.processor.image_mean), "std": tuple(trained.processor.image_std)}
    metrics = evaluate_preference(trained.model, trained.tokenizer, pairs, **stats)
    from transformers import CLIPModel

    init = evaluate_preference(CLIPModel.from_pretrained(clip_dir).eval(), trained.tokenizer, pairs, **stats)
    metrics |= {
        "init_clip": init,
        "train_s": train_s,
        "final_train": final_metrics(trained.history),
        "clip": str(clip_dir),
    }
    out = save_reward_model(args.out, trained, {"config": cfg.model_dump(mode="json"), "metrics": metrics})
    metrics["dir_mb"] = _dir_size_mb(out)
    print(
        f"world PickScore written to {out} ({metrics['dir_mb']:.2f} MB) in {train_s:.0f} s: pair accuracy "
        f"{metrics['pair_acc']:.3f} (world CLIP before fine-tuning: {init['pair_acc']:.3f})"
    )
    if args.metrics:
        write_json_atomic(args.metrics, metrics)


def _write_grid(path: str | Path, images: np.ndarray, cols: int) -> None:
    from PIL import Image

    n, h, w, _ = images.shape
    rows = (n + cols - 1) // cols
    grid = np.zeros((rows * (h + 2), cols * (w + 2), 3), dtype=np.uint8)
    for i, im in enumerate(images):
        r, c = divmod(i, cols)
        grid[r * (h + 2) + 1 : r * (h + 2) + 1 + h, c * (w + 2) + 1 : c * (w + 2) + 1 + w] = im
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid).resize((grid.shape[1] * 4, grid.shape[0] * 4), Image.Resampling.NEAREST).save(path)


def _print_table(summary: dict[str, Any]) -> None:
    print(f"{'tag':<14}{'strict':>8}{'partial':>9}{'images':>8}")
    for tag, row in summary.get("per_tag", {}).items():
        print(f"{tag:<14}{row['strict']:>8.3f}{row['partial']:>9.3f}{row['images']:>8d}")
    if "geneval_strict" in summary:
        print(f"{'overall':<14}{summary['geneval_strict']:>8.3f}{summary['geneval_partial']:>9.3f}")
        print(f"prompts with varied group rewards: {summary['varied_group_frac']:.3f}")
    if "ocr" in summary:
        print(f"ocr: {summary['ocr']:.3f} over {summary['ocr_images']} images")


def _quiet_libraries() -> None:
    """Keep diffusers / transformers to errors: their per-save shard bars and the "text_encoder_3=None cannot
    be saved" notice (expected: the embedded default has no T5) would bury the training progress."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.set_verbosity_error()
    diffusers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vgrpo.cli", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def with_params(p: argparse.ArgumentParser) -> None:
        p.add_argument("--params", nargs="+", default=["params/embedded/pretrain.yaml"], help="params files")
        p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override a params entry")

    p = sub.add_parser("world-splits", help="write the seeded train/test prompt files")
    with_params(p)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_world_splits)

    p = sub.add_parser("pretrain", help="pretrain the embedded base pipeline")
    with_params(p)
    p.add_argument("--splits", required=True, help="folder with test.jsonl (periodic evaluation prompts)")
    p.add_argument("--out", required=True, help="the final pipeline directory")
    p.add_argument("--work", default="runs/pretrain", help="checkpoints (a run resumes from the newest)")
    p.add_argument("--metrics", help="write wall time, peak memory and final metrics here (JSON)")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=cmd_pretrain)

    p = sub.add_parser("evaluate", help="GenEval-style table and OCR score of a pipeline on world prompts")
    p.add_argument("pipeline", help="a StableDiffusion3Pipeline directory")
    p.add_argument("--prompts", required=True, help="world metadata JSONL (GenEval format + ocr)")
    p.add_argument("--out", required=True, help="JSON result file")
    p.add_argument("--grid", help="PNG grid of the first 8 prompts' samples")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=20, help="Euler steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=0, help="first N prompts only (0 = all)")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("train-world-clip", help="train the world CLIP (the embedded CLIPScore model)")
    p.add_argument("--params", nargs="+", default=["params/embedded/rewards.yaml"], help="params files")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override a world_clip entry")
    p.add_argument("--splits", required=True, help="folder with test.jsonl (held-out evaluation prompts)")
    p.add_argument("--out", required=True, help="the model directory (CLIPModel, tokenizer, image processor)")
    p.add_argument("--metrics", help="write held-out accuracies, training time and size here (JSON)")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=cmd_train_world_clip)

    p = sub.add_parser("train-world-preference", help="fine-tune the world CLIP into the world PickScore model")
    p.add_argument("--params", nargs="+", default=["params/embedded/rewards.yaml"], help="params files")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override a world_pickscore entry")
    p.add_argument("--clip", required=True, help="the world CLIP directory it starts from")
    p.add_argument("--out", required=True, help="the model directory (CLIPModel, tokenizer, image processor)")
    p.add_argument("--metrics", help="write held-out pair accuracies, training time and size here (JSON)")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=cmd_train_world_preference)

    args = parser.parse_args(argv)
    _quiet_libraries()
    try:
        args.func(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        from vgrpo.models.pipeline import PipelineError

        if not isinstance(exc, PipelineError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
