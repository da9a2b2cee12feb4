"""Command line for the embedded world and base model.

    python -m vgrpo.cli world-splits --params params/embedded/pretrain.yaml --out data/world
    python -m vgrpo.cli pretrain --params params/embedded/pretrain.yaml --splits data/world --out models/embedded-base
    python -m vgrpo.cli evaluate models/embedded-base --prompts data/world/test.jsonl --out metrics/base_eval.json \
        --params params/embedded/evaluate.yaml --set num_steps=20
    python -m vgrpo.cli export models/embedded-base --lora runs/dvc/stages/5-ocr --out models/embedded-rl
    python -m vgrpo.cli train-world-clip --params params/embedded/rewards.yaml --splits data/world --out DIR
    python -m vgrpo.cli train-world-preference --params params/embedded/rewards.yaml --clip DIR --out DIR2
    python -m vgrpo.cli train --params params/base.yaml params/models/embedded.yaml params/stages/embedded/S.yaml \
        --out runs/S/lora --work-dir runs/S/work [--init-lora DIR]
    accelerate launch --config_file configs/accelerate/ddp_8gpu.yaml -m vgrpo.cli train --params ... --out DIR

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

from vgrpo.config import ConfigError, PretrainConfig, load_config, overrides_from_pairs
from vgrpo.guards import TrainingDiverged

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


def _read_metadata(path: str | Path) -> list[dict[str, Any]]:
    from vgrpo.prompts import load_prompts

    return load_prompts(path)


def cmd_pretrain(args: argparse.Namespace) -> None:
    import torch

    from vgrpo.atomic import write_json_atomic
    from vgrpo.evaluation import evaluate as evaluate_pipeline
    from vgrpo.pretrain import pretrain
    from vgrpo.rewards.multi import MultiReward

    cfg = _pretrain_config(args)
    torch.set_num_threads(args.threads)
    eval_md = _read_metadata(Path(args.splits) / "test.jsonl")[: cfg.eval_prompts]
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


def cmd_evaluate(args: argparse.Namespace) -> None:
    import torch

    from vgrpo.atomic import write_json_atomic
    from vgrpo.checkpoint import LORA_FILE
    from vgrpo.config import EvaluationConfig
    from vgrpo.evaluation import evaluate, write_grid
    from vgrpo.models.pipeline import build_adapter, load_pipeline
    from vgrpo.rewards.multi import MultiReward

    cfg = load_config(args.params, overrides_from_pairs(args.set), section="evaluation", schema=EvaluationConfig)
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    metadata = _read_metadata(args.prompts)[: cfg.max_prompts]
    if args.lora is not None and not (Path(args.lora) / LORA_FILE).is_file():
        raise ConfigError(f"--lora {args.lora}: no {LORA_FILE} there (not an adapter directory written by a stage)")
    pipe = load_pipeline(args.pipeline)
    if args.lora is not None:  # a stage's adapter, read the way a plain diffusers script reads it
        pipe.load_lora_weights(args.lora, use_safetensors=True)
    adapter, policy = build_adapter(pipe)
    base = None
    if cfg.base_pipeline is not None:
        base_pipe = load_pipeline(cfg.base_pipeline)
        if type(base_pipe) is not type(pipe):
            raise ConfigError(
                f"base_pipeline {cfg.base_pipeline} is a {type(base_pipe).__name__}, the evaluated pipeline a "
                f"{type(pipe).__name__}: hybrid sampling needs the same model family"
            )
        base = build_adapter(base_pipe)[1].eval()
    with MultiReward.from_specs([r.model_dump() for r in cfg.rewards]) as rewards:
        table, images = evaluate(
            adapter=adapter, policy=policy.eval(), metadata=metadata,
            rewards=rewards, group_size=cfg.group_size, num_steps=cfg.num_steps, seed=cfg.seed,
            shift=adapter.scheduler_shift, guidance_scale=cfg.guidance_scale, base=base, p_mix=cfg.p_mix,
            micro_batch=cfg.micro_batch, overlap=cfg.overlap, progress=True,
        )  # fmt: skip
    table |= {"pipeline": str(args.pipeline), "lora": args.lora, "prompt_file": str(args.prompts)}
    write_json_atomic(args.out, table)
    if args.grid and cfg.grid_prompts:
        write_grid(args.grid, images[: cfg.grid_prompts * cfg.group_size], cfg.group_size)
    _print_table(table)


def cmd_export(args: argparse.Namespace) -> None:
    from vgrpo.checkpoint import CheckpointError, export_merged_pipeline
    from vgrpo.models.pipeline import load_pipeline

    pipe = load_pipeline(args.pipeline)
    try:
        export_merged_pipeline(pipe, Path(args.lora), Path(args.out), lora_scale=args.scale)
    except CheckpointError as exc:
        raise ConfigError(f"--lora {exc}") from exc
    print(f"wrote {args.out} ({_dir_size_mb(Path(args.out)):.1f} MB): {args.pipeline} + {args.lora} merged")


def _dir_size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def cmd_train_world_clip(args: argparse.Namespace) -> None:
    import torch

    from vgrpo.atomic import write_json_atomic
    from vgrpo.config import WorldCLIPConfig
    from vgrpo.rewards.world_eval import evaluate_clip, preference_records
    from vgrpo.rewards.world_models import final_metrics, save_reward_model, train_world_clip
    from vgrpo.world.prompts import scene_from_dict

    cfg = load_config(args.params, overrides_from_pairs(args.set), section="world_clip", schema=WorldCLIPConfig)
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

    from vgrpo.atomic import write_json_atomic
    from vgrpo.config import WorldPreferenceConfig
    from vgrpo.rewards.world_eval import evaluate_preference
    from vgrpo.rewards.world_models import final_metrics, save_reward_model
    from vgrpo.rewards.world_preference import evaluation_pairs, train_world_preference

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
    metrics["dir_mb"] = _dir_size_mb(out)
    print(
        f"world PickScore written to {out} ({metrics['dir_mb']:.2f} MB) in {train_s:.0f} s: pair accuracy "
        f"{metrics['pair_acc']:.3f} (world CLIP before fine-tuning: {init['pair_acc']:.3f})"
    )
    if args.metrics:
        write_json_atomic(args.metrics, metrics)


def cmd_train(args: argparse.Namespace) -> None:
    """One stage (:func:`vgrpo.stage.run_stage`), sharded over the processes ``accelerate launch`` started."""
    import os

    import torch

    from vgrpo.atomic import write_json_atomic
    from vgrpo.config import StageConfig
    from vgrpo.distributed import Distributed, samples_per_process
    from vgrpo.stage import run_stage

    cfg = load_config(args.params, overrides_from_pairs(args.set), schema=StageConfig)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))  # checked before the processes wait for each other
    try:
        samples_per_process(cfg.rollout.prompts_per_iteration, cfg.rollout.group_size, cfg.optim.minibatches,
                            world_size)  # fmt: skip
    except ValueError as exc:
        raise ConfigError(f"{' + '.join(args.params)}: {exc}") from exc
    torch.set_num_threads(args.threads)
    dist = Distributed.from_environment()

    def log(metrics: dict[str, float], iteration: int) -> None:
        if metrics.get("guard/skipped"):
            return  # on_skip says why
        print(f"{cfg.name} iteration {iteration}: reward {metrics.get('reward/total_mean', float('nan')):.4f}, "
              f"{metrics['time/iteration_s']:.1f} s", flush=True)  # fmt: skip

    def on_skip(event: dict[str, Any]) -> None:
        print(f"{cfg.name} iteration {event['iteration']}: skipped, non-finite {event['quantity']} "
              f"({event.get('count', '?')} of {event.get('of', '?')}); no update applied", flush=True)  # fmt: skip

    result = run_stage(cfg, pipeline_dir=Path(args.pipeline or cfg.pipeline), work_dir=Path(args.work_dir),
                       out_dir=Path(args.out), init_lora=Path(args.init_lora) if args.init_lora else None,
                       root=Path(args.root), log=log, on_skip=on_skip, dist=dist)  # fmt: skip
    if dist.is_main:
        if args.metrics:
            summary: dict[str, Any] = {"history": result.history, "evaluations": result.evaluations}
            summary |= {"resumed_from": result.resumed_from, "world_size": dist.world_size}
            write_json_atomic(args.metrics, summary)
        print(
            f"{cfg.name}: {result.out_dir} written after {result.iterations} iterations on {dist.world_size} processes"
        )


def _print_table(table: dict[str, Any]) -> None:
    for key, entry in table["rewards"].items():
        if "per_tag" in entry:
            print(f"{key + ' tag':<16}{'strict':>8}{'partial':>9}{'images':>8}")
            for tag, row in entry["per_tag"].items():
                print(f"{tag:<16}{row['strict']:>8.3f}{row['partial']:>9.3f}{row['images']:>8d}")
            print(f"{'overall':<16}{entry['geneval_strict']:>8.3f}{entry['geneval_partial']:>9.3f}")
    for key, entry in table["rewards"].items():
        mean = "n/a" if entry["mean"] is None else f"{entry['mean']:.4f}"
        varied = entry["varied_group_frac"]
        print(f"{key}: {mean} over {entry['images']} images; prompts whose group varies: "
              f"{'n/a' if varied is None else f'{varied:.3f}'}")  # fmt: skip
    print(f"{table['samples']} samples in {table['seconds']['total']:.0f} s")


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

    def with_params(p: argparse.ArgumentParser, default: str = "params/embedded/pretrain.yaml") -> None:
        p.add_argument("--params", nargs="+", default=[default], help="params files, merged in order")
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

    p = sub.add_parser("evaluate", help="per-reward table (GenEval per tag, OCR, preference) and image grid")
    p.add_argument("pipeline", help="a StableDiffusion3Pipeline or FluxPipeline directory")
    p.add_argument("--lora", default=None, help="a LoRA directory (a stage's output) loaded with load_lora_weights")
    with_params(p, "params/embedded/evaluate.yaml")
    p.add_argument("--prompts", required=True, help="metadata JSONL (GenEval format, world splits) or .txt prompts")
    p.add_argument("--out", required=True, help="JSON result file")
    p.add_argument("--grid", help="PNG grid of the first `grid_prompts` prompts' samples")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("export", help="merge a stage's LoRA into the base and write a full diffusers pipeline")
    p.add_argument("pipeline", help="the base pipeline directory the adapter was trained on")
    p.add_argument("--lora", required=True, help="the LoRA directory (a stage's output)")
    p.add_argument("--out", required=True, help="the merged pipeline directory (written atomically)")
    p.add_argument("--scale", type=float, default=1.0, help="LoRA scale at merge (1 = as trained)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("train-world-clip", help="train the world CLIP (the embedded CLIPScore model)")
    with_params(p, "params/embedded/rewards.yaml")
    p.add_argument("--splits", required=True, help="folder with test.jsonl (held-out evaluation prompts)")
    p.add_argument("--out", required=True, help="the model directory (CLIPModel, tokenizer, image processor)")
    p.add_argument("--metrics", help="write held-out accuracies, training time and size here (JSON)")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=cmd_train_world_clip)

    p = sub.add_parser("train-world-preference", help="fine-tune the world CLIP into the world PickScore model")
    with_params(p, "params/embedded/rewards.yaml")
    p.add_argument("--clip", required=True, help="the world CLIP directory it starts from")
    p.add_argument("--out", required=True, help="the model directory (CLIPModel, tokenizer, image processor)")
    p.add_argument("--metrics", help="write held-out pair accuracies, training time and size here (JSON)")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=cmd_train_world_preference)

    p = sub.add_parser("train", help="train one stage; under `accelerate launch -m vgrpo.cli train` on every process")
    p.add_argument("--params", nargs="+", required=True, help="base, model and stage params files, merged in order")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override a params entry")
    p.add_argument("--out", required=True, help="the stage's adapter (or full pipeline) directory")
    p.add_argument("--work-dir", default="runs/work", help="checkpoints (a run resumes from the newest of its params)")
    p.add_argument("--init-lora", default=None, help="the previous stage's adapter directory")
    p.add_argument("--pipeline", default=None, help="base pipeline directory (default: the params' `pipeline`)")
    p.add_argument("--root", default=".", help="folder the params' prompt and model paths are relative to")
    p.add_argument("--metrics", help="write the per-iteration history and evaluations here (JSON, rank 0)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads per process")
    p.set_defaults(func=cmd_train)

    args = parser.parse_args(argv)
    _quiet_libraries()
    try:
        args.func(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TrainingDiverged as exc:  # the last checkpoint is intact; the message says where it is
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except ValueError as exc:
        from vgrpo.models.pipeline import PipelineError
        from vgrpo.prompts import PromptFileError

        if not isinstance(exc, PipelineError | PromptFileError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
