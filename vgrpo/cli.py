"""Command line: train a stage, evaluate a pipeline, export a merged pipeline.

    python -m vgrpo.cli evaluate models/embedded-base --prompts data/world/test.jsonl --out metrics/base_eval.json \
        --params params/embedded/evaluate.yaml --set num_steps=20
    python -m vgrpo.cli export models/embedded-base --lora runs/dvc/stages/5-ocr --out models/embedded-rl
    python -m vgrpo.cli train --params params/base.yaml params/models/embedded.yaml params/stages/embedded/S.yaml \
        --out runs/S/lora --work-dir runs/S/work [--init-lora DIR]
    accelerate launch --config_file configs/accelerate/ddp_8gpu.yaml -m vgrpo.cli train --params ... --out DIR

The embedded world's own jobs (prompt splits, base pretraining, its reward models) are :mod:`vgrpo.world.cli`.
``--set key.sub=value`` overrides an entry of the params section (``steps=20``, ``vae.steps=10``; the value is
parsed as YAML). Each command parses its arguments and calls one library function; bad input (params, prompt
files, pipeline or adapter directories: :class:`vgrpo.errors.UserError`) exits with status 2 and one message naming
the file and the key, a diverged stage with 3.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vgrpo.errors import UserError

# torch, diffusers and transformers are imported inside the commands, so `vgrpo --help` answers at once.

__all__ = ["add_params_arguments", "configure_logging", "main", "run_command", "use_threads"]

EXAMPLES = """examples:
  vgrpo train --params params/base.yaml params/models/embedded.yaml params/stages/embedded/1-preference.yaml \\
      --out runs/s1/lora --work-dir runs/s1/work --set iterations=2
  vgrpo evaluate models/embedded-base --prompts data/world/test.jsonl --out runs/base_eval.json \\
      --set num_steps=20 --grid runs/base_grid.png
  vgrpo export models/embedded-base --lora runs/s1/lora --out runs/s1/merged
  vgrpo evaluate PIPELINE --prompts counting.jsonl --out sources.json --images sources --set group_size=1
  vgrpo edit-set --sources sources.json --out data/counting_edit
  accelerate launch --config_file configs/accelerate/ddp_8gpu.yaml -m vgrpo.cli train --params ... --out DIR

Bad input exits with status 2 and one message naming the file and the key; a diverged stage with 3.
The embedded world's own jobs (prompt splits, base pretraining, reward models): python -m vgrpo.world.cli --help
"""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults after each option's help (not where there is none to tell: a required option, a flag, ``None``), and
    the epilog's examples kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, argparse.SUPPRESS) or action.required or action.nargs == 0:
            return action.help
        return super()._get_help_string(action)


def use_threads(threads: int, *, flush_denormal: bool = False) -> None:
    """This process's torch CPU threads, and with ``flush_denormal`` denormal floats flushed to zero."""
    import torch

    torch.set_num_threads(threads)
    if flush_denormal:
        torch.set_flush_denormal(True)


def cmd_evaluate(args: argparse.Namespace) -> None:
    from vgrpo.evaluation.config import EvaluationConfig
    from vgrpo.evaluation.report import evaluate_to_files, format_table
    from vgrpo.outputs import Output
    from vgrpo.params_file import load_params, overrides_from_pairs
    from vgrpo.rewards.config import reward_classes
    from vgrpo.training.preflight import PreflightError, preflight_evaluation

    cfg = load_params(args.params, overrides_from_pairs(args.set), section="evaluation", schema=EvaluationConfig)
    outputs = [Output("--out", Path(args.out), is_file=True)]
    outputs += [Output("--grid", Path(args.grid), is_file=True)] if args.grid else []
    outputs += [Output("--images", Path(args.images), replaced=False)] if args.images else []
    read = {f"--params {file}": file for file in args.params} | ({"--baseline": args.baseline} if args.baseline else {})
    problems = preflight_evaluation(cfg, args.pipeline, args.prompts, lora=args.lora, outputs=outputs, inputs=read)
    if problems:
        raise PreflightError(problems)
    use_threads(args.threads, flush_denormal=True)
    table = evaluate_to_files(
        cfg,
        args.pipeline,
        args.prompts,
        args.out,
        lora=args.lora,
        grid=args.grid,
        baseline=args.baseline,
        images_dir=args.images,
    )
    print(format_table(table, reward_classes(cfg.rewards)))


def cmd_edit_set(args: argparse.Namespace) -> None:
    from vgrpo.counting_edit import write_edit_set

    written = write_edit_set(args.sources, args.out, seed=args.seed)
    print(f"{args.out}: " + ", ".join(f"{n} {name}" for name, n in written.items()) + " counting edits")


def cmd_export(args: argparse.Namespace) -> None:
    from vgrpo.atomic import dir_size_mb
    from vgrpo.checkpoints.weight_files import adapter_problems, pipeline_problems
    from vgrpo.outputs import Output, check_outputs
    from vgrpo.trainer import export_lora_merged
    from vgrpo.training.preflight import PreflightError, Problem

    check_outputs([Output("--out", Path(args.out))], {"pipeline": args.pipeline, "--lora adapter": args.lora})
    problems = pipeline_problems(Path(args.pipeline)) + adapter_problems(Path(args.lora))
    if problems:
        raise PreflightError([Problem(p) for p in problems])
    export_lora_merged(Path(args.pipeline), Path(args.lora), Path(args.out), lora_scale=args.scale)
    print(f"wrote {args.out} ({dir_size_mb(Path(args.out)):.1f} MB): {args.pipeline} + {args.lora} merged")


def cmd_train(args: argparse.Namespace) -> None:
    """One stage (:class:`vgrpo.trainer.Trainer`), sharded over the processes ``accelerate launch`` started, after
    :func:`vgrpo.training.preflight.preflight` has checked every input it reads."""
    from vgrpo.atomic import write_json_atomic
    from vgrpo.config import load_stage, overrides_from_pairs
    from vgrpo.outputs import Output
    from vgrpo.parallel.distributed import Distributed
    from vgrpo.trainer import Trainer

    world_size = int(os.environ.get("WORLD_SIZE", "1"))  # checked before the processes wait for each other
    cfg = load_stage(args.params, overrides_from_pairs(args.set), world_size=world_size)
    trainer = Trainer(
        cfg,
        work_dir=Path(args.work_dir),
        pipeline=args.pipeline,
        out_dir=Path(args.out),
        init_lora=args.init_lora,
        root=Path(args.root),
        progress=args.verbosity >= 0,
    )
    metrics = [Output("--metrics", Path(args.metrics), is_file=True)] if args.metrics else []
    params = {f"--params {file}": file for file in args.params}
    trainer.preflight(labels=("--out", "--work-dir"), outputs=metrics, inputs=params)
    use_threads(args.threads)
    dist = trainer.dist = Distributed.from_environment()
    result = trainer.train()
    if dist.is_main:
        if args.metrics:
            summary: dict[str, Any] = {"history": result.history, "evaluations": result.evaluations}
            summary |= {"resumed_from": result.resumed_from, "world_size": dist.world_size}
            write_json_atomic(args.metrics, summary)
        print(
            f"{cfg.name}: {result.out_dir} written after {result.iterations} iterations on {dist.world_size} processes"
        )


def configure_logging(verbosity: int) -> None:
    """The command line's logging: the library's ``vgrpo`` loggers at INFO (``-q``: WARNING, ``-v``: DEBUG) on
    stderr, so that its warnings (a corrupt checkpoint set aside, an iteration skipped) show at every verbosity;
    diffusers and transformers at ERROR without their progress bars (their per-save shard bars and
    expected notices, such as "text_encoder_3=None cannot be saved" for the embedded default, would bury the
    training progress) unless ``-v``."""
    level = {-1: logging.WARNING, 0: logging.INFO}.get(verbosity, logging.DEBUG)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("vgrpo").setLevel(level)
    logging.captureWarnings(True)  # warnings.warn's (a library's deprecation notice) in the same stream and format
    if verbosity > 0:
        return
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


def add_verbosity_arguments(p: argparse.ArgumentParser) -> None:
    """``-v/--verbose`` and ``-q/--quiet`` (``args.verbosity``: 1, -1, 0 without either)."""
    group = p.add_mutually_exclusive_group()
    verbose, quiet = "debug logs and the libraries' notices", "warnings and errors only (no progress line)"
    group.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=1, default=0, help=verbose)
    group.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1, help=quiet)


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command (``args.func``). Bad input (a :class:`vgrpo.errors.UserError`: params, prompt files,
    pipeline, adapter or checkpoint directories) prints its one-line message and returns 2, a diverged stage 3;
    anything else is a bug and propagates with its traceback."""
    configure_logging(getattr(args, "verbosity", 0))
    from vgrpo.training.guards import TrainingDiverged

    try:
        args.func(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TrainingDiverged as exc:  # the last checkpoint is intact; the message says where it is
        print(f"error: {exc}", file=sys.stderr)
        return 3
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``vgrpo`` parser: ``train``, ``evaluate``, ``export``, each with its defaults and the examples."""
    parser = argparse.ArgumentParser(
        prog="vgrpo", description=__doc__.splitlines()[0], epilog=EXAMPLES, formatter_class=_HelpFormatter
    )
    add_verbosity_arguments(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,evaluate,export,edit-set}")

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=summary, description=summary, epilog=EXAMPLES, formatter_class=_HelpFormatter)
        add_verbosity_arguments(p)
        return p

    p = command("train", "train one stage; under `accelerate launch -m vgrpo.cli train` on every process")
    p.add_argument("--params", nargs="+", required=True, help="base, model and stage params files, merged in order")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override a params entry (YAML value)")
    p.add_argument("--out", required=True, help="the stage's adapter (or full pipeline) directory")
    p.add_argument("--work-dir", default="runs/work", help="checkpoints (a run resumes from the newest of its params)")
    p.add_argument("--init-lora", default=None, help="the previous stage's adapter directory")
    p.add_argument("--pipeline", default=None, help="base pipeline directory (default: the params' `pipeline`)")
    p.add_argument("--root", default=".", help="folder the params' prompt and model paths are relative to")
    p.add_argument("--metrics", help="write the per-iteration history and evaluations here (JSON, rank 0)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads per process")
    p.set_defaults(func=cmd_train)

    p = command("evaluate", "per-reward table (GenEval per tag, OCR, preference) and image grid")
    p.add_argument("pipeline", help="a diffusers pipeline directory of a family in vgrpo.models.registry")
    p.add_argument("--lora", default=None, help="a LoRA directory (a stage's output) loaded with load_lora_weights")
    add_params_arguments(p, "params/embedded/evaluate.yaml")
    p.add_argument("--prompts", required=True, help="metadata JSONL (GenEval format, world splits) or .txt prompts")
    p.add_argument("--out", required=True, help="JSON result file")
    p.add_argument("--grid", help="PNG grid of the first `grid_prompts` prompts' samples, captioned and marked")
    p.add_argument("--baseline", help="an earlier --out of the same prompts and settings: add paired gains with CIs")
    p.add_argument("--images", help="folder for every sample as NNNNN-K.png (prompt row, sample), e.g. edit sources")
    p.add_argument("--threads", type=int, default=2, help="CPU threads")
    p.set_defaults(func=cmd_evaluate)

    p = command("export", "merge a stage's LoRA into the base and write a full diffusers pipeline")
    p.add_argument("pipeline", help="the base pipeline directory the adapter was trained on")
    p.add_argument("--lora", required=True, help="the LoRA directory (a stage's output)")
    p.add_argument("--out", required=True, help="the merged pipeline directory (written atomically)")
    p.add_argument("--scale", type=float, default=1.0, help="LoRA scale at merge (1 = as trained)")
    p.set_defaults(func=cmd_export)

    summary = "a counting-edit set (an editing family's prompts) from a model's samples of GenEval counting prompts"
    p = command("edit-set", summary)
    p.add_argument("--sources", required=True, help="an `evaluate --images` result of GenEval counting prompts")
    p.add_argument("--out", required=True, help="folder of train/validation/test.jsonl and images/ (replaced whole)")
    p.add_argument("--seed", type=int, default=0, help="seed of the target counts and the split")
    p.set_defaults(func=cmd_edit_set)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
