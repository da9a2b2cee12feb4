"""What ``dvc metrics show`` and ``dvc plots show`` read, drawn from the stages' detailed outputs (seconds, no model).

    python -m tasks.dvc_report summary --src metrics --out metrics/summary --evaluation params/embedded/evaluate.yaml
    python -m tasks.dvc_report plots plots/stages
    python -m tasks.dvc_report side-by-side plots/base_grid.png plots/curriculum_grid.png --titles base curriculum \
        --out plots/base_vs_curriculum.png

``summary`` writes one small JSON per detailed metrics file of the world stages (``pretrain``, ``world_detector``,
``world_clip``, ``world_pickscore``, ``evaluate_base``, ``evaluate_curriculum``) with a few headline numbers under
short names shared with the curriculum stages' files (the headline columns of the rewards ``--evaluation`` names), so
``dvc metrics show`` prints one narrow table. ``plots``
draws each per-iteration plots JSON of the curriculum stages as a PNG next to it (training reward, the loss's KL
term, gradient norm): ``dvc plots show`` embeds images, which need no JavaScript from a CDN. ``side-by-side`` puts
captioned evaluation grids of the same prompts and seeds next to each other (the base and the trained model).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vgrpo.atomic import write_json_atomic
from vgrpo.evaluation.config import EvaluationConfig
from vgrpo.evaluation.grids import side_by_side, write_png
from vgrpo.evaluation.tables import headline_metrics
from vgrpo.params_file import load_params
from vgrpo.rewards.config import RewardConfig

__all__ = ["SUMMARIES", "flat_eval", "main", "moving_average", "plot_stage", "summaries"]


def flat_eval(table: Mapping[str, Any]) -> dict[str, float]:
    """An evaluation table's per-reward numbers as flat ``eval/KEY`` (the mean) and ``eval/KEY_NAME`` floats."""
    out: dict[str, float] = {}
    for key, entry in table["rewards"].items():
        for name, value in entry.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and name != "images":
                out[f"eval/{key}" if name == "mean" else f"eval/{key}_{name}"] = float(value)
    return out


def _rounded(**values: float) -> dict[str, float]:
    return {k: round(float(v), 5) for k, v in values.items()}


# Detailed metrics file (its stem under --src) -> its headline numbers. `acc` is what a world reward model gets
# right on its held-out check: retrieval (world_clip), preference pairs (world_pickscore), the prompt's clauses
# on the base VAE's round trips of ground-truth renders (world_detector, whose `ocr` is the OCR reward on those
# round trips). The evaluations (base_eval, curriculum_eval, and the held-out-pair probe's base_probe,
# curriculum_probe) give the headline numbers of their rewards.
SUMMARIES: dict[str, Callable[[Mapping[str, Any]], dict[str, float]]] = {
    "pretrain": lambda m: {"wall_s": round(m["wall_s"], 1), **_rounded(loss=m["final"]["loss"])},
    "world_detector": lambda m: _rounded(acc=m["vae_roundtrip"], ocr=m["ocr"]["vae_roundtrip"]),
    "world_clip": lambda m: _rounded(acc=m["retrieval_acc"]),
    "world_pickscore": lambda m: _rounded(acc=m["pair_acc"]),
}
EVALUATIONS = ("base_eval", "curriculum_eval", "base_probe", "curriculum_probe")


def summaries(src: Path, rewards: Sequence[RewardConfig]) -> dict[str, dict[str, float]]:
    """Every :data:`SUMMARIES` entry of the detailed files under ``src``, and the headline numbers of ``rewards``
    in each of :data:`EVALUATIONS`, by stem (a missing file is an error)."""
    read = {stem: json.loads((src / f"{stem}.json").read_text()) for stem in (*SUMMARIES, *EVALUATIONS)}
    out = {stem: fn(read[stem]) for stem, fn in SUMMARIES.items()}
    return out | {stem: headline_metrics(flat_eval(read[stem]), rewards) for stem in EVALUATIONS}


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """The mean of each value and the ``window - 1`` before it (fewer at the start)."""
    return [sum(values[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))]


PANELS = ("reward/total_mean", "train/kl", "train/grad_norm")  # the training history's keys


def plot_stage(rows: Sequence[Mapping[str, float]], title: str, out: Path, window: int = 10) -> None:
    """A stage's training curves per iteration, one panel per :data:`PANELS` key: the rollouts' mean reward (with
    its moving average over ``window`` iterations), the loss's KL term and the gradient norm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["iteration"] for r in rows]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(11, 3), dpi=100)
    for ax, key in zip(axes, PANELS, strict=True):
        y = [float(r.get(key, float("nan"))) for r in rows]
        ax.plot(x, y, lw=1, alpha=0.5 if key == "reward/total_mean" else 1.0)
        if key == "reward/total_mean":
            ax.plot(x, moving_average(y, window), lw=2, label=f"mean of {window}")
            ax.legend(loc="lower right", fontsize=8)
        ax.set(xlabel="iteration", title=key)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, format="png", metadata={"Software": None})  # no version stamp: same rows, same bytes
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.dvc_report", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    summary = commands.add_parser("summary", help="headline metrics of the world stages' detailed files")
    summary.add_argument("--src", required=True, help="folder of the detailed metrics files")
    summary.add_argument("--out", required=True, help="folder to write the headline files into")
    summary.add_argument("--evaluation", required=True, help="the evaluations' params file (its evaluation.rewards)")
    plots = commands.add_parser("plots", help="a PNG next to every per-iteration plots JSON of a folder")
    plots.add_argument("folder", help="folder of plots JSON files (one row per iteration)")
    pair = commands.add_parser("side-by-side", help="evaluation grid PNGs next to each other, each titled")
    pair.add_argument("grids", nargs="+", help="grid PNG files")
    pair.add_argument("--titles", nargs="+", required=True, help="one title per grid")
    pair.add_argument("--out", required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    if args.command == "summary":
        evaluation = load_params([args.evaluation], section="evaluation", schema=EvaluationConfig)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for stem, numbers in summaries(Path(args.src), evaluation.rewards).items():
            write_json_atomic(out / f"{stem}.json", numbers)
            print(f"{out / stem}.json: {numbers}")
    elif args.command == "side-by-side":
        grids = [np.asarray(Image.open(p).convert("RGB")) for p in args.grids]
        write_png(Path(args.out), side_by_side(grids, args.titles))
        print(args.out)
    else:
        for path in sorted(Path(args.folder).glob("*.json")):
            plot_stage(json.loads(path.read_text()), path.stem, path.with_suffix(".png"))
            print(path.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
