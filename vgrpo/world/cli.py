"""Command line of the embedded world: its prompt splits, the base model's pretraining and its learned rewards.

    python -m vgrpo.world.cli world-splits --params params/embedded/pretrain.yaml --out data/world
    python -m vgrpo.world.cli pretrain --params params/embedded/pretrain.yaml --splits data/world \
        --out models/embedded-base
    python -m vgrpo.world.cli train-world-clip --params params/embedded/rewards.yaml --splits data/world --out DIR
    python -m vgrpo.world.cli train-world-preference --params params/embedded/rewards.yaml --clip DIR --out DIR2
    python -m vgrpo.world.cli detector-check --prompts data/world/test.jsonl --pipeline models/embedded-base \
        --out metrics/world_detector.json
    python -m vgrpo.world.cli counting-edits --splits data/world --out data/world/edits

``--set key.sub=value`` overrides an entry of the params section, as in :mod:`vgrpo.cli`. Each command parses
its arguments and calls one library function (:mod:`vgrpo.world.prompts`, :mod:`vgrpo.world.pretrain`,
:mod:`vgrpo.world.reward_models`, :mod:`vgrpo.world.quality`); bad input exits with status 2 and one message naming
the file and the key.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vgrpo.atomic import write_json_atomic
from vgrpo.cli import add_params_arguments, run_command, use_threads
from vgrpo.params_file import load_params, overrides_from_pairs
from vgrpo.world.config import PretrainConfig, WorldCLIPConfig, WorldPreferenceConfig
from vgrpo.world.pretrain import pretrain_base
from vgrpo.world.prompts import write_splits
from vgrpo.world.quality import check_split
from vgrpo.world.reward_models import make_world_clip, make_world_pickscore

__all__ = ["main"]


def _pretrain_config(args: argparse.Namespace) -> PretrainConfig:
    return load_params(args.params, overrides_from_pairs(args.set), section="pretrain", schema=PretrainConfig)


def cmd_world_splits(args: argparse.Namespace) -> None:
    cfg = _pretrain_config(args)
    out = Path(args.out)
    n_train, n_test, n_probe, n_validation = write_splits(
        out,
        cfg.seed,
        cfg.train_prompts,
        cfg.test_prompts,
        held_out_pairs=cfg.held_out_pairs,
        tags=cfg.split_tags,
        n_probe=cfg.probe_prompts,
        n_validation=args.validation,
    )
    print(f"wrote {n_train} train, {n_test} test, {n_probe} probe and {n_validation} validation prompts to {out}")


def cmd_counting_edits(args: argparse.Namespace) -> None:
    from vgrpo.errors import UserError
    from vgrpo.world.edits import write_counting_edits
    from vgrpo.world.records import read_split

    splits = {name: Path(args.splits) / f"{name}.jsonl" for name in args.names}
    missing = [str(path) for path in splits.values() if not path.is_file()]
    if missing:
        raise UserError(f"--splits: no world split file {', '.join(missing)}")
    written = write_counting_edits(
        {name: read_split(path) for name, path in splits.items()}, args.out, seed=args.seed, size=args.size
    )
    print(f"wrote {', '.join(f'{n} {name}' for name, n in written.items())} counting edits to {args.out}")


def _report(args: argparse.Namespace, metrics: dict[str, Any], line: str) -> None:
    """A training command's end: its one-line summary, and its metrics to ``--metrics`` when given."""

    print(line)
    if args.metrics:
        write_json_atomic(args.metrics, metrics)


def cmd_pretrain(args: argparse.Namespace) -> None:
    cfg = _pretrain_config(args)
    use_threads(args.threads)
    final, metrics = pretrain_base(cfg, Path(args.splits) / "test.jsonl", args.work, args.out)
    _report(args, metrics, f"pipeline written to {final} in {metrics['wall_s']:.0f} s")


def cmd_train_world_clip(args: argparse.Namespace) -> None:
    cfg = load_params(args.params, overrides_from_pairs(args.set), section="world_clip", schema=WorldCLIPConfig)
    use_threads(args.threads, flush_denormal=True)
    metrics = make_world_clip(cfg, Path(args.splits) / "test.jsonl", args.out)
    _report(
        args,
        metrics,
        f"world CLIP written to {Path(args.out)} ({metrics['dir_mb']:.2f} MB) in "
        f"{metrics['train_s']:.0f} s: retrieval {metrics['retrieval_acc']:.3f} (chance "
        f"{metrics['retrieval_chance']:.3f}), in-batch i2t {metrics['in_batch_i2t_top1']:.3f}",
    )


def cmd_train_world_preference(args: argparse.Namespace) -> None:
    overrides = overrides_from_pairs(args.set)
    cfg = load_params(args.params, overrides, section="world_pickscore", schema=WorldPreferenceConfig)
    use_threads(args.threads, flush_denormal=True)
    metrics = make_world_pickscore(cfg, args.clip, args.out)
    _report(
        args,
        metrics,
        f"world PickScore written to {Path(args.out)} ({metrics['dir_mb']:.2f} MB) in "
        f"{metrics['train_s']:.0f} s: pair accuracy {metrics['pair_acc']:.3f} (world CLIP before fine-tuning: "
        f"{metrics['init_clip']['pair_acc']:.3f})",
    )


def cmd_detector_check(args: argparse.Namespace) -> None:
    held_out = _pretrain_config(args).held_out_pairs if args.params else ()
    quality = check_split(args.prompts, args.pipeline, held_out)
    write_json_atomic(args.out, quality)
    print(
        " ".join(
            f"{k}={quality[k]:.3f}" for k in ("ground_truth", "vae_roundtrip", "noise", "wrong_prompt") if k in quality
        ),
        f"over {quality['images']} images;",
        "mutations accuracy={:.3f} false_credit={:.3f};".format(
            quality["mutations"]["accuracy"], quality["mutations"]["false_credit"]
        ),
        " ".join(f"ocr_{k}={v:.3f}" for k, v in quality["ocr"].items() if k in ("ground_truth", "vae_roundtrip")),
    )


def _training_command(
    sub: Any, name: str, summary: str, params: str, metrics: str, func: Callable[[argparse.Namespace], None]
) -> argparse.ArgumentParser:
    """A command that trains one of the world's models: ``--params`` (default ``params``) and ``--set``,
    ``--metrics`` (``metrics``: what is written there) and ``--threads``; the caller adds its inputs and ``--out``."""
    p = sub.add_parser(name, help=summary)
    add_params_arguments(p, params)
    p.add_argument("--metrics", help=metrics)
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=func)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vgrpo.world.cli", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("world-splits", help="write the seeded train/test prompt files")
    add_params_arguments(p, "params/embedded/pretrain.yaml")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--validation",
        type=int,
        default=0,
        help="rows of validation.jsonl, the split recipe selection reads (0: none); texts outside the test split",
    )
    p.set_defaults(func=cmd_world_splits)

    p = sub.add_parser("counting-edits", help="write the counting-edit set (an editing family's prompts and sources)")
    p.add_argument("--splits", required=True, help="folder of the world's split files")
    p.add_argument("--out", required=True, help="folder of <split>.jsonl and images/")
    p.add_argument("--names", nargs="+", default=["train", "validation", "test"], help="the splits to edit")
    p.add_argument("--seed", type=int, default=0, help="seed of the target counts")
    p.add_argument("--size", type=int, default=32, help="the sources' side in pixels")
    p.set_defaults(func=cmd_counting_edits)

    p = _training_command(
        sub,
        "pretrain",
        "pretrain the embedded base pipeline",
        "params/embedded/pretrain.yaml",
        "write wall time, peak memory and final metrics here (JSON)",
        cmd_pretrain,
    )
    p.add_argument("--splits", required=True, help="folder with test.jsonl (periodic evaluation prompts)")
    p.add_argument("--out", required=True, help="the final pipeline directory")
    p.add_argument("--work", default="runs/pretrain", help="checkpoints (a run resumes from the newest)")

    p = _training_command(
        sub,
        "train-world-clip",
        "train the world CLIP (the embedded CLIPScore model)",
        "params/embedded/rewards.yaml",
        "write held-out accuracies, training time and size here (JSON)",
        cmd_train_world_clip,
    )
    p.add_argument("--splits", required=True, help="folder with test.jsonl (held-out evaluation prompts)")
    p.add_argument("--out", required=True, help="the model directory (CLIPModel, tokenizer, image processor)")

    p = _training_command(
        sub,
        "train-world-preference",
        "fine-tune the world CLIP into the world PickScore model",
        "params/embedded/rewards.yaml",
        "write held-out pair accuracies, training time and size here (JSON)",
        cmd_train_world_preference,
    )
    p.add_argument("--clip", required=True, help="the world CLIP directory it starts from")
    p.add_argument("--out", required=True, help="the model directory (CLIPModel, tokenizer, image processor)")

    p = sub.add_parser(
        "detector-check", help="the world detector on ground truth, VAE round trips, noise, wrong prompts"
    )
    p.add_argument(
        "--prompts", required=True, help="a world split file with ground-truth scenes (data/world/test.jsonl)"
    )
    p.add_argument("--pipeline", help="a pipeline whose VAE round-trips the ground truth (models/embedded-base)")
    p.add_argument(
        "--params",
        nargs="+",
        help="the pretraining params (params/embedded/pretrain.yaml): scenes with its held-out pairs, which the VAE "
        "never saw, are counted apart",
    )
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override a pretraining param")
    p.add_argument("--out", required=True, help="JSON result file")
    p.set_defaults(func=cmd_detector_check)

    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
