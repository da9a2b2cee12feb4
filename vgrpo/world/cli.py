"""Command line of the embedded world: its prompt splits, the base model's pretraining and its learned rewards.

    python -m vgrpo.world.cli world-splits --params params/embedded/pretrain.yaml --out data/world
    python -m vgrpo.world.cli pretrain --params params/embedded/pretrain.yaml --splits data/world \
        --out models/embedded-base
    python -m vgrpo.world.cli train-world-clip --params params/embedded/rewards.yaml --splits data/world --out DIR
    python -m vgrpo.world.cli train-world-preference --params params/embedded/rewards.yaml --clip DIR --out DIR2
    python -m vgrpo.world.cli detector-check --prompts data/world/test.jsonl --pipeline models/embedded-base \
        --out metrics/world_detector.json

``--set key.sub=value`` overrides an entry of the params section, as in :mod:`vgrpo.cli`; errors in params or
prompt files exit with status 2 and one message naming the file and the key.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vgrpo.cli import add_params_arguments, dir_size_mb, run_command
from vgrpo.config import load_config, overrides_from_pairs
from vgrpo.errors import ConfigError
from vgrpo.prompts import load_prompts
from vgrpo.world.config import PretrainConfig

__all__ = ["main"]


def _pretrain_config(args: argparse.Namespace) -> PretrainConfig:
    return load_config(args.params, overrides_from_pairs(args.set), section="pretrain", schema=PretrainConfig)


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


def cmd_pretrain(args: argparse.Namespace) -> None:
    import torch

    from vgrpo.atomic import write_json_atomic
    from vgrpo.evaluation import evaluate as evaluate_pipeline
    from vgrpo.rewards.multi import MultiReward
    from vgrpo.world.pretrain import pretrain

    cfg = _pretrain_config(args)
    torch.set_num_threads(args.threads)
    eval_md = load_prompts(Path(args.splits) / "test.jsonl")[: cfg.eval_prompts]
    rewards = MultiReward.from_specs([{"name": "geneval"}, {"name": "ocr"}])

    def evaluate(adapter: Any, velocity: Any, step: int) -> dict[str, float]:
        table, _ = evaluate_pipeline(
            adapter=adapter, policy=velocity, metadata=eval_md, rewards=rewards, group_size=cfg.eval_group,
            num_steps=cfg.sample_steps, seed=cfg.seed, shift=cfg.model.scheduler_shift,
        )  # fmt: skip
        geneval, ocr = table["rewards"]["geneval"], table["rewards"]["ocr"]
        out = {k: geneval.get(k) for k in ("geneval_strict", "geneval_partial", "varied_group_frac")}
        out["ocr"] = ocr["mean"]
        return {k: float(v) for k, v in out.items() if v is not None}

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


def _records_with_scenes(path: Path) -> list[Any]:
    """``(metadata, scene)`` of every row of a world split file; a row without its ground-truth ``scene`` is a
    :class:`ConfigError` naming the file and line."""
    from vgrpo.world.prompts import scene_from_dict

    rows = load_prompts(path)
    for i, md in enumerate(rows, 1):
        if "scene" not in md:
            raise ConfigError(f"{path}:{i}: a record needs its ground-truth 'scene' (a world split file)")
    return [(md, scene_from_dict(md["scene"])) for md in rows]


def cmd_train_world_clip(args: argparse.Namespace) -> None:
    import torch

    from vgrpo.atomic import write_json_atomic
    from vgrpo.world.clip import final_metrics, save_reward_model, train_world_clip
    from vgrpo.world.config import WorldCLIPConfig
    from vgrpo.world.reward_eval import evaluate_clip, preference_records

    cfg = load_config(args.params, overrides_from_pairs(args.set), section="world_clip", schema=WorldCLIPConfig)
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    test_path = Path(args.splits) / "test.jsonl"
    records = _records_with_scenes(test_path)
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
    metrics["dir_mb"] = dir_size_mb(out)
    print(
        f"world CLIP written to {out} ({metrics['dir_mb']:.2f} MB) in {train_s:.0f} s: retrieval "
        f"{metrics['retrieval_acc']:.3f} (chance {metrics['retrieval_chance']:.3f}), in-batch i2t "
        f"{metrics['in_batch_i2t_top1']:.3f}"
    )
    if args.metrics:
        write_json_atomic(args.metrics, metrics)


def cmd_train_world_preference(args: argparse.Namespace) -> None:
    import torch

    from vgrpo.atomic import write_json_atomic
    from vgrpo.world.clip import final_metrics, save_reward_model
    from vgrpo.world.config import WorldPreferenceConfig
    from vgrpo.world.preference import evaluation_pairs, train_world_preference
    from vgrpo.world.reward_eval import evaluate_preference

    overrides = overrides_from_pairs(args.set)
    cfg = load_config(args.params, overrides, section="world_pickscore", schema=WorldPreferenceConfig)
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

    init = evaluate_preference(
        CLIPModel.from_pretrained(clip_dir, use_safetensors=True).eval(), trained.tokenizer, pairs, **stats
    )
    metrics |= {
        "init_clip": init,
        "train_s": train_s,
        "final_train": final_metrics(trained.history),
        "clip": str(clip_dir),
    }
    out = save_reward_model(args.out, trained, {"config": cfg.model_dump(mode="json"), "metrics": metrics})
    metrics["dir_mb"] = dir_size_mb(out)
    print(
        f"world PickScore written to {out} ({metrics['dir_mb']:.2f} MB) in {train_s:.0f} s: pair accuracy "
        f"{metrics['pair_acc']:.3f} (world CLIP before fine-tuning: {init['pair_acc']:.3f})"
    )
    if args.metrics:
        write_json_atomic(args.metrics, metrics)


def cmd_detector_check(args: argparse.Namespace) -> None:
    import torch

    from vgrpo.atomic import write_json_atomic
    from vgrpo.images import images_to_tensor, tensor_to_images
    from vgrpo.world.quality import detector_quality

    path = Path(args.prompts)
    records = _records_with_scenes(path)
    roundtrip = None
    if args.pipeline is not None:
        from vgrpo.models.pipeline import SD3Adapter, load_sd3_pipeline

        adapter = SD3Adapter(load_sd3_pipeline(args.pipeline))
        generator = torch.Generator().manual_seed(0)

        @torch.no_grad()
        def roundtrip(images: Any) -> Any:
            latents = adapter.encode_images(images_to_tensor(images), generator=generator)
            return tensor_to_images(adapter.decode(latents))

    quality = detector_quality(records, roundtrip=roundtrip)
    quality |= {"prompts": str(path), "pipeline": args.pipeline}
    write_json_atomic(args.out, quality)
    print(" ".join(f"{k}={quality[k]:.3f}" for k in ("ground_truth", "vae_roundtrip", "noise", "wrong_prompt")
                   if k in quality), f"over {quality['images']} images")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vgrpo.world.cli", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("world-splits", help="write the seeded train/test prompt files")
    add_params_arguments(p, "params/embedded/pretrain.yaml")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_world_splits)

    p = sub.add_parser("pretrain", help="pretrain the embedded base pipeline")
    add_params_arguments(p, "params/embedded/pretrain.yaml")
    p.add_argument("--splits", required=True, help="folder with test.jsonl (periodic evaluation prompts)")
    p.add_argument("--out", required=True, help="the final pipeline directory")
    p.add_argument("--work", default="runs/pretrain", help="checkpoints (a run resumes from the newest)")
    p.add_argument("--metrics", help="write wall time, peak memory and final metrics here (JSON)")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=cmd_pretrain)

    p = sub.add_parser("train-world-clip", help="train the world CLIP (the embedded CLIPScore model)")
    add_params_arguments(p, "params/embedded/rewards.yaml")
    p.add_argument("--splits", required=True, help="folder with test.jsonl (held-out evaluation prompts)")
    p.add_argument("--out", required=True, help="the model directory (CLIPModel, tokenizer, image processor)")
    p.add_argument("--metrics", help="write held-out accuracies, training time and size here (JSON)")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=cmd_train_world_clip)

    p = sub.add_parser("train-world-preference", help="fine-tune the world CLIP into the world PickScore model")
    add_params_arguments(p, "params/embedded/rewards.yaml")
    p.add_argument("--clip", required=True, help="the world CLIP directory it starts from")
    p.add_argument("--out", required=True, help="the model directory (CLIPModel, tokenizer, image processor)")
    p.add_argument("--metrics", help="write held-out pair accuracies, training time and size here (JSON)")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=cmd_train_world_preference)

    p = sub.add_parser(
        "detector-check", help="the world detector on ground truth, VAE round trips, noise, wrong prompts"
    )
    p.add_argument(
        "--prompts", required=True, help="a world split file with ground-truth scenes (data/world/test.jsonl)"
    )
    p.add_argument("--pipeline", help="a pipeline whose VAE round-trips the ground truth (models/embedded-base)")
    p.add_argument("--out", required=True, help="JSON result file")
    p.set_defaults(func=cmd_detector_check)

    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
