"""Command line: train a stage, evaluate a pipeline, export a merged pipeline.

    python -m vgrpo.cli evaluate models/embedded-base --prompts data/world/test.jsonl --out metrics/base_eval.json \
        --params params/embedded/evaluate.yaml --set num_steps=20
    python -m vgrpo.cli export models/embedded-base --lora runs/dvc/stages/5-ocr --out models/embedded-rl
    python -m vgrpo.cli train --params params/base.yaml params/models/embedded.yaml params/stages/embedded/S.yaml \
        --out runs/S/lora --work-dir runs/S/work [--init-lora DIR]
    accelerate launch --config_file configs/accelerate/ddp_8gpu.yaml -m vgrpo.cli train --params ... --out DIR

The embedded world's own jobs (prompt splits, base pretraining, its reward models) are :mod:`vgrpo.world.cli`.
``--set key.sub=value`` overrides an entry of the params section (``steps=20``, ``vae.steps=10``; the value is
parsed as YAML). Errors in params, prompt files or pipeline directories exit with status 2 and one message
naming the file and the key.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vgrpo.config import load_config, overrides_from_pairs
from vgrpo.errors import ConfigError
from vgrpo.guards import TrainingDiverged

__all__ = ["add_params_arguments", "dir_size_mb", "main", "run_command"]


def dir_size_mb(path: Path) -> float:
    """Size of the files under ``path`` in MiB."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def _read_metadata(path: str | Path) -> list[dict[str, Any]]:
    from vgrpo.prompts import load_prompts

    return load_prompts(path)


def cmd_evaluate(args: argparse.Namespace) -> None:
    import torch

    from vgrpo.atomic import write_json_atomic
    from vgrpo.checkpoint import LORA_FILE
    from vgrpo.evaluation import compare, evaluate, grid_of, write_grid
    from vgrpo.evaluation_config import EvaluationConfig
    from vgrpo.models.pipeline import build_adapter, load_pipeline
    from vgrpo.rewards.multi import MultiReward

    cfg = load_config(args.params, overrides_from_pairs(args.set), section="evaluation", schema=EvaluationConfig)
    baseline = _read_evaluation(args.baseline) if args.baseline is not None else None
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
    if baseline is not None:
        try:
            compare(table, baseline)
        except ValueError as exc:
            raise ConfigError(f"--baseline {args.baseline}: {exc}") from exc
        table["baseline"] = str(args.baseline)
    if args.grid and cfg.grid_prompts:
        write_grid(args.grid, **grid_of(table, images, cfg.grid_prompts))
    # The per-prompt scores go beside the table: DVC and readers of the metrics file see the summary only.
    write_json_atomic(_scores_path(args.out), table.pop("per_prompt"))
    write_json_atomic(args.out, table)
    _print_table(table)


def _scores_path(out: str | Path) -> Path:
    """Where ``evaluate --out FILE`` writes its per-prompt scores: ``FILE`` with ``.scores.json``."""
    return Path(out).with_suffix(".scores.json")


def _read_evaluation(path: str | Path) -> dict[str, Any]:
    """An evaluation written by ``evaluate --out``, with its per-prompt scores put back."""
    scores = _scores_path(path)
    for f in (Path(path), scores):
        if not f.is_file():
            raise ConfigError(f"--baseline {path}: {f} does not exist (written by `evaluate --out {path}`)")
    try:
        table = json.loads(Path(path).read_text())
        table["per_prompt"] = json.loads(scores.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--baseline {path}: not JSON ({exc})") from exc
    return dict(table)


def cmd_export(args: argparse.Namespace) -> None:
    from vgrpo.checkpoint import CheckpointError, export_merged_pipeline
    from vgrpo.models.pipeline import load_pipeline

    pipe = load_pipeline(args.pipeline)
    try:
        export_merged_pipeline(pipe, Path(args.lora), Path(args.out), lora_scale=args.scale)
    except CheckpointError as exc:
        raise ConfigError(f"--lora {exc}") from exc
    print(f"wrote {args.out} ({dir_size_mb(Path(args.out)):.1f} MB): {args.pipeline} + {args.lora} merged")


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


def _with_ci(value: float | None, ci: list[float] | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}" + (f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else "")


def _print_table(table: dict[str, Any]) -> None:
    """The evaluation table with 95% intervals, and the gains over the baseline when it has them."""
    gains = "baseline" in table
    for key, entry in table["rewards"].items():
        if "per_tag" in entry:
            print(f"{key + ' tag':<16}{'strict [95% CI]':>24}{'partial':>9}{'images':>8}"
                  + (f"{'gain [95% CI]':>26}" if gains else ""))  # fmt: skip
            for tag, row in entry["per_tag"].items():
                gain = f"{_with_ci(row['strict_gain'], row['strict_gain_ci']):>26}" if gains else ""
                print(f"{tag:<16}{_with_ci(row['strict'], row['strict_ci']):>24}{row['partial']:>9.3f}"
                      f"{row['images']:>8d}{gain}")  # fmt: skip
            gain = f"{_with_ci(entry['geneval_strict_gain'], entry['geneval_strict_gain_ci']):>34}" if gains else ""
            print(f"{'overall':<16}{_with_ci(entry['geneval_strict'], entry['geneval_strict_ci']):>24}"
                  f"{entry['geneval_partial']:>9.3f}{gain}")  # fmt: skip
    for key, entry in table["rewards"].items():
        varied = entry["varied_group_frac"]
        gain = f"; gain {_with_ci(entry['gain'], entry['gain_ci'], 4)}" if gains and "gain" in entry else ""
        print(f"{key}: {_with_ci(entry['mean'], entry['mean_ci'], 4)} over {entry['images']} images{gain}; "
              f"prompts whose group varies: {'n/a' if varied is None else f'{varied:.3f}'}")  # fmt: skip
    print(f"{table['samples']} samples in {table['seconds']['total']:.0f} s (95% CIs: bootstrap over prompts)")


def _quiet_libraries() -> None:
    """Keep diffusers / transformers to errors: their per-save shard bars and the "text_encoder_3=None cannot
    be saved" notice (expected: the embedded default has no T5) would bury the training progress."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.set_verbosity_error()
    diffusers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()


def add_params_arguments(p: argparse.ArgumentParser, default: str) -> None:
    """``--params FILE...`` (merged in order, ``default`` when absent) and ``--set KEY=VALUE...``."""
    p.add_argument("--params", nargs="+", default=[default], help="params files, merged in order")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override a params entry")


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command (``args.func``); a user error (bad params, prompt file or pipeline directory) prints
    one line and returns 2, a diverged stage 3."""
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vgrpo.cli", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("evaluate", help="per-reward table (GenEval per tag, OCR, preference) and image grid")
    p.add_argument("pipeline", help="a StableDiffusion3Pipeline or FluxPipeline directory")
    p.add_argument("--lora", default=None, help="a LoRA directory (a stage's output) loaded with load_lora_weights")
    add_params_arguments(p, "params/embedded/evaluate.yaml")
    p.add_argument("--prompts", required=True, help="metadata JSONL (GenEval format, world splits) or .txt prompts")
    p.add_argument("--out", required=True, help="JSON result file")
    p.add_argument("--grid", help="PNG grid of the first `grid_prompts` prompts' samples, captioned and marked")
    p.add_argument("--baseline", help="an earlier --out of the same prompts and settings: add paired gains with CIs")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("export", help="merge a stage's LoRA into the base and write a full diffusers pipeline")
    p.add_argument("pipeline", help="the base pipeline directory the adapter was trained on")
    p.add_argument("--lora", required=True, help="the LoRA directory (a stage's output)")
    p.add_argument("--out", required=True, help="the merged pipeline directory (written atomically)")
    p.add_argument("--scale", type=float, default=1.0, help="LoRA scale at merge (1 = as trained)")
    p.set_defaults(func=cmd_export)

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

    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
