"""An evaluation as files: :func:`vgrpo.evaluation.evaluator.evaluate` of a pipeline directory (with a stage's LoRA or
not)
on a prompt file, its table written beside its per-prompt scores, an earlier one read back as the baseline of
paired gains, and the table as text.

This is the body of ``python -m vgrpo.cli evaluate`` (the DVC stages ``evaluate_base`` and
``evaluate_curriculum``); its errors name the inputs as that command spells them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vgrpo.atomic import write_json_atomic
from vgrpo.checkpoints.state import LORA_FILE
from vgrpo.errors import ConfigError, UserError
from vgrpo.evaluation.config import EvaluationConfig
from vgrpo.evaluation.evaluator import Sampling, evaluate, sampling_shift
from vgrpo.evaluation.grids import grid_of, write_grid, write_png
from vgrpo.evaluation.tables import compare
from vgrpo.models.pipeline import build_adapter, load_pipeline
from vgrpo.prompts import load_prompts
from vgrpo.rewards.base import Reward, with_interval
from vgrpo.rewards.config import reward_classes
from vgrpo.rewards.multi import MultiReward

__all__ = ["evaluate_to_files", "format_table", "read_evaluation", "scores_path"]


def sample_png_name(row: int, sample: int) -> str:
    """The file ``evaluate_to_files`` writes sample ``sample`` of prompt row ``row`` to under ``images_dir``."""
    return f"{row:05d}-{sample}.png"


def scores_path(out: str | Path) -> Path:
    """Where an evaluation written to ``out`` keeps its per-prompt scores: ``out`` with ``.scores.json``."""
    return Path(out).with_suffix(".scores.json")


def read_evaluation(path: str | Path, label: str = "--baseline") -> dict[str, Any]:
    """An evaluation written by :func:`evaluate_to_files`, with its per-prompt scores put back; errors name it as
    ``label`` (the flag the user gave it with)."""
    scores = scores_path(path)
    for f in (Path(path), scores):
        if not f.is_file():
            raise UserError(f"{label} {path}: {f} does not exist (written by `evaluate --out {path}`)")
    try:
        table = json.loads(Path(path).read_text())
        per_prompt = json.loads(scores.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{label} {path}: not JSON ({exc})") from exc
    if not isinstance(table, dict) or not isinstance(per_prompt, dict):
        raise UserError(f"{label} {path}: not an evaluation (expected JSON objects in {path} and {scores})")
    return table | {"per_prompt": per_prompt}


def evaluate_to_files(
    config: EvaluationConfig,
    pipeline: str | Path,
    prompts: str | Path,
    out: str | Path,
    *,
    lora: str | Path | None = None,
    grid: str | Path | None = None,
    baseline: str | Path | None = None,
    images_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Evaluate ``pipeline`` (plus the LoRA directory ``lora``, read by diffusers' ``load_lora_weights`` as a
    plain diffusers script would) on the first ``config.max_prompts`` rows of ``prompts``.

    Writes the table to ``out`` and its per-prompt scores beside it (:func:`scores_path`: DVC and readers of the
    metrics file see the summary only), and the image grid of the first ``config.grid_prompts`` prompts to
    ``grid``, and every sample to ``images_dir`` (``NNNNN-K.png``: prompt row ``NNNNN``, sample ``K``; the table
    names the folder as ``images_dir``). With ``baseline`` (an earlier ``out`` of the same prompts and settings)
    the table adds paired gains with their intervals. Returns the table as written.

    Raises:
        UserError: a missing or unreadable baseline, prompt file, pipeline or adapter directory, or a baseline
            of other prompts or settings.
    """
    if images_dir is not None and config.num_frames:
        raise UserError(f"--images {images_dir}: an evaluation of videos (num_frames) writes no image files")
    reference = read_evaluation(baseline) if baseline is not None else None
    metadata = load_prompts(prompts)[: config.max_prompts]
    if lora is not None and not (Path(lora) / LORA_FILE).is_file():
        raise UserError(f"--lora {lora}: no {LORA_FILE} there (not an adapter directory written by a stage)")
    pipe = load_pipeline(pipeline)
    if lora is not None:
        pipe.load_lora_weights(lora, use_safetensors=True)
    adapter, policy = build_adapter(pipe, resolution=config.resolution, num_frames=config.num_frames)
    base = None
    if config.base_pipeline is not None:
        base_pipe = load_pipeline(config.base_pipeline)
        if type(base_pipe) is not type(pipe):
            raise ConfigError(
                f"base_pipeline {config.base_pipeline} is a {type(base_pipe).__name__}, the evaluated pipeline a "
                f"{type(pipe).__name__}: hybrid sampling needs the same model family"
            )
        base = build_adapter(base_pipe)[1].eval()
    with MultiReward.from_configs(config.rewards) as rewards:
        table, images = evaluate(
            adapter=adapter,
            policy=policy.eval(),
            metadata=metadata,
            rewards=rewards,
            group_size=config.group_size,
            sampling=Sampling.of(
                config,
                sampling_shift(
                    config.shift,
                    adapter,
                    rollout_shift=adapter.pipeline_shift(config.num_steps),
                    num_steps=config.num_steps,
                ),
            ),
            base=base,
            micro_batch=config.micro_batch,
            overlap=config.overlap,
            progress=True,
        )
    table |= {"pipeline": str(pipeline), "lora": None if lora is None else str(lora), "prompt_file": str(prompts)}
    if reference is not None:
        try:
            compare(table, reference, reward_classes(config.rewards))
        except ValueError as exc:
            raise UserError(f"--baseline {baseline}: {exc}") from exc
        table["baseline"] = str(baseline)
    if grid and config.grid_prompts:
        write_grid(grid, **grid_of(table, images, config.grid_prompts))
    if images_dir is not None:
        for k, image in enumerate(images):
            write_png(Path(images_dir) / sample_png_name(*divmod(k, config.group_size)), image)
        table["images_dir"] = str(images_dir)
    write_json_atomic(scores_path(out), table.pop("per_prompt"))
    write_json_atomic(out, table)
    return table


def format_table(table: dict[str, Any], rewards: Mapping[str, type[Reward]]) -> str:
    """The evaluation table with 95% intervals, and the gains over the baseline when it has them, as text: what each
    reward's class prints of its entry (:meth:`vgrpo.rewards.base.Reward.table_lines`; ``rewards``: key -> class,
    :func:`vgrpo.rewards.config.reward_classes`), then each reward's mean."""
    gains = "baseline" in table
    lines = []
    for key, entry in table["rewards"].items():
        lines += rewards.get(key, Reward).table_lines(key, entry, gains)
    for key, entry in table["rewards"].items():
        varied = entry["varied_group_frac"]
        gain = f"; gain {with_interval(entry['gain'], entry['gain_ci'], 4)}" if gains and "gain" in entry else ""
        mean = with_interval(entry["mean"], entry["mean_ci"], 4)
        spread = "n/a" if varied is None else f"{varied:.3f}"
        lines.append(f"{key}: {mean} over {entry['images']} images{gain}; prompts whose group varies: {spread}")
    lines.append(f"{table['samples']} samples in {table['seconds']['total']:.0f} s (95% CIs: bootstrap over prompts)")
    return "\n".join(lines)
