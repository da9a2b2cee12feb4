"""Clutter per stage: the share of images with more objects than the prompt names (:mod:`vgrpo.world.clutter`), on
the validation split's single-object and colour prompts, for the base and after each stage of a curriculum run; and
its figure.

    python -m benchmarks.clutter measure --run-dir runs/curriculum/embedded-curriculum \
        [--curriculum params/curricula/embedded.yaml] [--prompts data/world/validation.jsonl] --out FILE
    python -m benchmarks.clutter figure FILE [FILE ...] --out plots/clutter.png

``measure`` samples each model as the evaluation does (20 Euler steps, 4 images a prompt, noise seed 1: the
validation seed of params/embedded/validation.yaml) and writes, atomically, one row per model: ``stage`` (``base``,
then each stage's name), ``clutter`` (the share), ``ci`` (its 95% bootstrap interval over prompts), ``images`` and
``adapter`` (the stage's adapter folder). ``figure`` draws each file's rows as one line, stage by stage, with
their intervals: a run whose line rises above the base's point made the scenes more cluttered.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vgrpo.atomic import write_json_atomic
from vgrpo.config import load_curriculum
from vgrpo.evaluation.config import EvaluationConfig
from vgrpo.rewards.config import RewardConfig
from vgrpo.world.clutter import CLUTTER_TAGS

__all__ = ["clutter_config", "measure", "plot_clutter"]

CLUTTER_REWARD = RewardConfig(name="vgrpo.world.clutter:ClutterReward", key="clutter")


def clutter_config(seed: int = 1, group_size: int = 4, num_steps: int = 20) -> EvaluationConfig:
    """The evaluation that measures clutter: the clutter column alone, on every clutter prompt, no grid."""
    return EvaluationConfig(
        group_size=group_size, num_steps=num_steps, seed=seed, grid_prompts=0, rewards=(CLUTTER_REWARD,)
    )


def _clutter_of(pipeline: Path, lora: Path | None, rows: list[dict[str, Any]], config: EvaluationConfig) -> dict:
    from vgrpo.evaluation.evaluator import Sampling, evaluate, sampling_shift
    from vgrpo.models.pipeline import build_adapter, load_pipeline
    from vgrpo.rewards.multi import MultiReward

    pipe = load_pipeline(pipeline)
    if lora is not None:
        pipe.load_lora_weights(lora, use_safetensors=True)
    adapter, policy = build_adapter(pipe, resolution=config.resolution)
    shift = sampling_shift(config.shift, adapter, rollout_shift=adapter.scheduler_shift)
    with MultiReward.from_configs(config.rewards) as rewards:
        table, _ = evaluate(
            adapter=adapter,
            policy=policy.eval(),
            metadata=rows,
            rewards=rewards,
            group_size=config.group_size,
            sampling=Sampling.of(config, shift),
            micro_batch=config.micro_batch,
            overlap=False,
        )
    entry = table["rewards"]["clutter"]
    return {"clutter": entry["mean"], "ci": entry["mean_ci"], "images": entry["images"]}


def measure(
    run_dir: Path,
    curriculum: Path,
    prompts: Path,
    root: Path = Path("."),
    config: EvaluationConfig | None = None,
    stages: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Clutter of the curriculum's base pipeline and of each stage's adapter under ``run_dir/stages`` (``stages``:
    these names only), on the clutter-tag rows of ``prompts``."""
    from vgrpo.prompts import load_prompts

    config = config or clutter_config()
    rows = [dict(r) for r in load_prompts(prompts) if r.get("tag") in CLUTTER_TAGS]
    if not rows:
        raise SystemExit(f"{prompts}: no {' or '.join(CLUTTER_TAGS)} prompts")
    _, configs = load_curriculum(curriculum, root=root)
    names = [c.name for c in configs if stages is None or c.name in stages]
    missing = [n for n in names if not (run_dir / "stages" / n).is_dir()]
    if missing:
        raise SystemExit(f"{run_dir}/stages: no adapter of {missing} (train the curriculum first)")
    pipeline = root / configs[0].pipeline
    out = [{"stage": "base", "adapter": None, **_clutter_of(pipeline, None, rows, config)}]
    for name in names:
        adapter = run_dir / "stages" / name
        out.append({"stage": name, "adapter": str(adapter), **_clutter_of(pipeline, adapter, rows, config)})
        print(f"clutter after {name}: {out[-1]['clutter']:.3f}", flush=True)
    return out


def plot_clutter(runs: dict[str, list[dict[str, Any]]], path: Path) -> None:
    """Each run's clutter stage by stage (the base first) with its 95% interval, as a PNG."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 4))
    ax = fig.subplots()
    for label, rows in runs.items():
        xs = list(range(len(rows)))
        ys = [r["clutter"] for r in rows]
        low = [r["clutter"] - r["ci"][0] if r.get("ci") else 0.0 for r in rows]
        high = [r["ci"][1] - r["clutter"] if r.get("ci") else 0.0 for r in rows]
        ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=label)
        ax.set_xticks(xs, [r["stage"] for r in rows], rotation=20, fontsize=8)
    ax.set_ylabel("cluttered images (share)")
    ax.set_title("More objects than the prompt names (validation: single object, colours)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    import json

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="clutter of the base and of each stage's adapter of a curriculum run")
    m.add_argument("--run-dir", type=Path, required=True, help="a curriculum run's folder (its stages/ adapters)")
    m.add_argument("--curriculum", type=Path, default=Path("params/curricula/embedded.yaml"))
    m.add_argument("--prompts", type=Path, default=Path("data/world/validation.jsonl"))
    m.add_argument("--out", type=Path, required=True)
    f = sub.add_parser("figure", help="draw clutter files stage by stage")
    f.add_argument("files", nargs="+", type=Path)
    f.add_argument("--out", type=Path, default=Path("plots/clutter.png"))
    args = parser.parse_args(argv)
    if args.command == "measure":
        rows = measure(args.run_dir, args.curriculum, args.prompts)
        write_json_atomic(args.out, {"prompts": str(args.prompts), "stages": rows})
        print(f"wrote {args.out}")
    else:
        runs = {path.stem: json.loads(path.read_text())["stages"] for path in args.files}
        plot_clutter(runs, args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
