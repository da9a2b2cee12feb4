"""Preflight: every input a run will read, checked before any compute and reported in one message.

It checks what the inputs say, not only that they exist:

* pipelines (a stage's ``pipeline``, the evaluation's ``base_pipeline``): ``model_index.json``, a folder for every
  component it names, and the header of every safetensors file in them, so a truncated or corrupt file is named
  with its path instead of surfacing as a library traceback mid-stage;
* prompt files (``prompts``, ``eval_prompts``), read as the stage reads them (an editing row's source image opened
  and read through), and checked by each reward that reads them (:meth:`vgrpo.rewards.base.Reward.check_prompts`:
  GenEval's clauses, and every class and colour they name against the detector's vocabulary);
* reward models: every ``path`` / ``*_path`` / ``*_file`` option opened (safetensors headers; a torch ``.pth`` as a
  zip archive, never unpickled; an mmdet config compiled, never run), every ``*url`` option a well-formed http(s)
  URL (reached, with ``connect``), and each reward's options against its constructor;
* the starting adapter (``init_lora``);
* the processes against the batch and the visible CUDA devices;
* the free disk under the checkpoint folder against an estimate of what the checkpoints take.

Reward paths resolve as the rewards read them (against the current directory); pipelines, prompt files and the
starting adapter against ``root``, as :class:`vgrpo.trainer.Trainer` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from vgrpo.checkpoints.weight_files import (
    adapter_fit_problems,
    adapter_problems,
    folder_problems,
    lora_target_problems,
    pipeline_problems,
    transformer_shapes,
    weights_problem,
)
from vgrpo.config import StageConfig
from vgrpo.config_batch import check_batch
from vgrpo.errors import UserError
from vgrpo.evaluation.config import EvaluationConfig
from vgrpo.models.folder import folder_lora_targets, is_pipeline_folder, read_geometry
from vgrpo.outputs import Output, output_problems
from vgrpo.parallel.launch import processes_per_machine
from vgrpo.params_file import unset_variables
from vgrpo.prompts import load_prompts
from vgrpo.rewards.checks import option_leaves, options_problem, url_problem
from vgrpo.rewards.config import prompt_problems
from vgrpo.training.checkpoint_disk import disk_problem
from vgrpo.training.prompt_rows import checked_rows, evaluation_rows, training_rows

__all__ = [
    "PreflightError",
    "Problem",
    "check_or_raise",
    "preflight",
    "preflight_evaluation",
]


@dataclass(frozen=True)
class Problem:
    """One bad input: ``message`` names the file, folder, URL or setting; ``used_by`` which stage and key read it."""

    message: str
    used_by: str = ""

    def __str__(self) -> str:
        return f"{self.message} ({self.used_by})" if self.used_by else self.message


class PreflightError(UserError):
    """Inputs a run would fail on; the message lists every :class:`Problem`, one per line."""

    def __init__(self, problems: Sequence[Problem]):
        self.problems = list(problems)
        count = f"{len(self.problems)} problem{'' if len(self.problems) == 1 else 's'}"
        super().__init__(f"preflight found {count} before any compute:\n" + "\n".join(f"  - {p}" for p in problems))


def _launch_problems(config: StageConfig, world_size: int | None) -> list[str]:
    """The processes (``world_size``, else the params' ``launch.processes``) against the batch and, when CUDA is in
    use, the devices this machine shows."""
    processes = world_size or config.launch.processes
    out = []
    try:
        check_batch(
            config.rollout.prompts_per_iteration, config.rollout.group_size, config.optim.minibatches, processes
        )
    except ValueError as exc:
        out.append(str(exc))
    per_machine = processes_per_machine(processes, config.launch.machines)
    if torch.cuda.is_available() and per_machine > torch.cuda.device_count():
        out.append(
            f"{per_machine} processes per machine, but {torch.cuda.device_count()} CUDA devices are visible "
            "(CUDA_VISIBLE_DEVICES): one process per device"
        )
    return out


class _Findings:
    """Problems in first-seen order, each input checked once however many stages name it."""

    def __init__(self, root: Path, connect: bool):
        self.root, self.connect = root, connect
        self.found: dict[str, list[str]] = {}
        self.variables: dict[str, list[str]] = {}
        self._done: dict[tuple[str, str], list[str]] = {}
        self.inputs: dict[str, Path] = {}

    def add(self, messages: Sequence[str], used_by: str) -> None:
        for message in messages:
            self.found.setdefault(message, []).append(used_by)

    def unset(self, value: str, used_by: str) -> bool:
        """Whether ``value`` still holds a ``${NAME}`` whose variable is unset (recorded for one problem per name)."""
        names = unset_variables(value)
        for name in names:
            self.variables.setdefault(name, []).append(used_by)
        return bool(names)

    def check(self, kind: str, value: str, used_by: str) -> None:
        """An input named by ``value``: ``pipeline``, ``adapter``, ``model`` (a reward's file or folder) or ``url``."""
        if self.unset(value, used_by):
            return
        path = Path(value) if kind == "model" else self.root / value
        if kind != "url":
            self.inputs.setdefault(used_by, path)
        if (kind, value) not in self._done:
            if kind == "url":
                self._done[kind, value] = [f"{value}: {p}"] if (p := url_problem(value, connect=self.connect)) else []
            elif kind == "model" and path.is_dir():
                self._done[kind, value] = folder_problems(path, safetensors_only=False)
            elif kind == "model":
                self._done[kind, value] = [f"{path}: {p}"] if (p := weights_problem(path)) else []
            else:
                self._done[kind, value] = (pipeline_problems if kind == "pipeline" else adapter_problems)(path)
        self.add(self._done[kind, value], used_by)

    def rewards(self, rewards: Sequence[Any], stage: str, section: str) -> None:
        for i, reward in enumerate(rewards):
            where = f"{stage}: {section}[{i}]"
            self.add([p] if (p := options_problem(reward)) else [], where)
            for leaf, dotted, value in option_leaves(reward.options, "options"):
                if isinstance(value, str) and (leaf == "path" or leaf.endswith(("_path", "_file"))):
                    self.check("model", value, f"{where}.{dotted}")
                elif isinstance(value, str) and leaf.endswith("url"):
                    self.check("url", value, f"{where}.{dotted}")

    def prompts(self, config: StageConfig) -> None:
        """Both prompt files, each checked by the rewards that read it (:meth:`vgrpo.rewards.base.Reward.check_prompts`)
        and then read as the stage reads them (the training rows after ``prompt_tags``, the first
        ``evaluation.max_prompts`` evaluation rows); read once for stages that read them alike."""
        train_key = (config.prompt_tags, config.prompt_tag_weights, config.rewards)
        readers: list[tuple[str, str, Any, Any, Any]] = [
            ("prompts", config.prompts, config.rewards, partial(training_rows, config, self.root), train_key)
        ]
        if config.eval_prompts:
            read_eval = partial(evaluation_rows, config, self.root)
            eval_key = (config.evaluation.max_prompts, config.evaluation.rewards)
            readers.append(("eval_prompts", config.eval_prompts, config.evaluation.rewards, read_eval, eval_key))
        if config.hold is not None:  # the hold checks read their own file, scored by the evaluation rewards
            hold = config.hold
            read_hold = partial(checked_rows, self.root / hold.prompts, config.evaluation.rewards)
            hold_key = (hold.max_prompts, config.evaluation.rewards)
            readers.append(("hold.prompts", hold.prompts, config.evaluation.rewards, read_hold, hold_key))
        for key, file, rewards, read, alike in readers:
            used_by = f"{config.name}: {key}"
            if self.unset(file, used_by):
                continue
            self.inputs.setdefault(used_by, self.root / file)
            done = (key, f"{file} {alike!r}")
            if done not in self._done:
                try:
                    path = self.root / file
                    kept = config.prompt_tags if key == "prompts" else None  # the tags the stage draws from
                    rows = load_prompts(path, open_images=True)
                    self._done[done] = prompt_problems(rewards, rows, path, kept_tags=kept)
                    if not self._done[done]:
                        read()  # what else the stage refuses: a prompt_tags filter that keeps nothing, ...
                except (UserError, ValueError) as exc:
                    self._done[done] = str(exc).splitlines()  # a bad condition image a line
            self.add(self._done[done], used_by)

    def problems(self) -> list[Problem]:
        out = [
            Problem(m, users[0] + (f", and {len(users) - 1} more" if len(users) > 1 else ""))
            for m, users in self.found.items()
        ]
        for name, users in self.variables.items():
            keys: dict[str, list[str]] = {}  # stage -> its keys that read the variable
            for user in dict.fromkeys(users):
                stage, _, key = user.partition(": ")
                keys.setdefault(stage, []).append(key)
            what = f"the environment variable {name} is not set: export {name}=<folder> (docs/real-models.md)"
            out.append(Problem(what, "read by " + "; ".join(f"{s}: {', '.join(k)}" for s, k in keys.items())))
        return out


def _model_problems(
    config: StageConfig, root: Path, init_lora: str | Path | None, shapes: dict[str, list[int]] | None
) -> list[str]:
    """The stage's image sides against its pipelines (:mod:`vgrpo.models.geometry`), its LoRA targets against the
    transformer's layers, and its starting adapter against the LoRA it builds; each skipped when the pipeline or
    adapter does not open (the other checks say why). ``shapes``: the pipeline transformer's
    (:func:`transformer_shapes`)."""
    out = []
    pipeline = root / config.pipeline
    geometry = read_geometry(pipeline)
    if geometry is not None:
        rollout = geometry.resolution_problem(config.rollout.resolution, "rollout.resolution")
        out += [rollout] if rollout else []
        out += [p] if (p := geometry.frames_problem(config.rollout.num_frames, "rollout.num_frames")) else []
        if config.eval_prompts and (
            p := geometry.frames_problem(config.evaluation.num_frames, "evaluation.num_frames")
        ):
            out.append(p)
        if config.eval_prompts:
            side = config.evaluation.resolution or config.rollout.resolution
            key = "evaluation.resolution" if config.evaluation.resolution else "rollout.resolution (evaluated at)"
            evaluation = geometry.resolution_problem(side, key)
            out += [evaluation] if evaluation and evaluation != rollout else []
    base = config.evaluation.base_pipeline
    if base and config.eval_prompts and (other := read_geometry(root / base)) is not None:
        side = config.evaluation.resolution or config.rollout.resolution
        out += [p] if (p := other.resolution_problem(side, "evaluation.resolution (of base_pipeline)")) else []
    targets = folder_lora_targets(config.lora, pipeline) if config.lora is not None else ()
    if config.lora is not None and shapes is not None:
        out += lora_target_problems(targets, shapes, pipeline)
    if init_lora is not None:
        init = root / init_lora
        if config.lora is None and not is_pipeline_folder(init):
            out.append(f"{init}: a LoRA starting adapter, but lora is null (a full fine-tune starts from a pipeline)")
        elif config.lora is not None and is_pipeline_folder(init):
            out.append(f"{init}: a whole pipeline as the starting adapter of a LoRA stage (give it as `pipeline`)")
        elif config.lora is not None and not adapter_problems(init):
            lora = config.lora
            out += adapter_fit_problems(init, rank=lora.rank, alpha=lora.alpha, targets=targets, shapes=shapes)
    return out


def preflight(
    stages: Sequence[StageConfig],
    root: str | Path = ".",
    *,
    init_lora: str | Path | None = None,
    world_size: int | None = None,
    checkpoint_dir: str | Path | None = None,
    connect: bool = False,
    outputs: Sequence[Output] = (),
    inputs: Mapping[str, str | Path] | None = None,
) -> list[Problem]:
    """Every problem with the inputs of ``stages`` (run in order; ``init_lora`` is the first one's starting adapter),
    before any compute (module docstring); empty when all is well.

    Args:
        root: the folder pipelines, prompt files and the starting adapter are relative to.
        world_size: the processes that will run each stage; None reads the params' ``launch.processes`` (default 1).
        checkpoint_dir: where the checkpoints go; None skips the disk check.
        connect: also open a TCP connection to every reward server URL.
        outputs: what the run writes (its adapter, work folder, result files): each checked against every input
            (:func:`vgrpo.outputs.output_problems`: none may be replaced, deleted or written into) and for writing.
        inputs: files the caller read that the stages do not name (its params files, by label), which the outputs
            may not overwrite either.
    """
    root = Path(root)
    findings = _Findings(root, connect)
    for cfg in stages:
        findings.check("pipeline", cfg.pipeline, f"{cfg.name}: pipeline")
        if cfg.evaluation.base_pipeline and cfg.eval_prompts:
            findings.check("pipeline", cfg.evaluation.base_pipeline, f"{cfg.name}: evaluation.base_pipeline")
        findings.prompts(cfg)
        findings.rewards(cfg.rewards, cfg.name, "rewards")
        if cfg.eval_prompts or cfg.hold is not None:
            findings.rewards(cfg.evaluation.rewards, cfg.name, "evaluation.rewards")
        findings.add(_launch_problems(cfg, world_size), f"{cfg.name}: launch")
    if init_lora is not None and stages:
        findings.check("adapter", str(init_lora), f"{stages[0].name}: starting adapter")
    shapes = {pipeline: transformer_shapes(root / pipeline) for pipeline in {cfg.pipeline for cfg in stages}}
    for i, cfg in enumerate(stages):
        findings.add(
            _model_problems(cfg, root, init_lora if i == 0 else None, shapes[cfg.pipeline]), f"{cfg.name}: model"
        )
    if outputs:
        findings.add(output_problems(outputs, {**findings.inputs, **(inputs or {})}), "outputs")
    if checkpoint_dir is not None:
        findings.add([p] if (p := disk_problem(stages, root, Path(checkpoint_dir), shapes)) else [], "checkpoints")
    return findings.problems()


def preflight_evaluation(
    config: EvaluationConfig,
    pipeline: str | Path,
    prompts: str | Path,
    *,
    lora: str | Path | None = None,
    outputs: Sequence[Output] = (),
    inputs: Mapping[str, str | Path] | None = None,
) -> list[Problem]:
    """Every problem with the inputs and outputs of one evaluation (``vgrpo evaluate``), before any compute: the
    pipeline (and ``evaluation.base_pipeline``), the adapter and its fit, the prompt file as each reward reads it,
    the rewards' options and files, the image side, and ``outputs`` against all of them and ``inputs`` (files the
    caller read: its params files, a baseline); empty when all is well."""
    findings = _Findings(Path("."), connect=False)
    findings.check("pipeline", str(pipeline), "pipeline")
    if config.base_pipeline:
        findings.check("pipeline", config.base_pipeline, "evaluation.base_pipeline")
    if lora is not None:
        findings.check("adapter", str(lora), "--lora")
        if not adapter_problems(Path(lora)) and not is_pipeline_folder(Path(lora)):
            findings.add(adapter_fit_problems(Path(lora), shapes=transformer_shapes(Path(pipeline))), "--lora")
    findings.inputs.setdefault("--prompts", Path(prompts))
    try:
        rows = load_prompts(Path(prompts), open_images=True)
        findings.add(prompt_problems(config.rewards, rows, prompts), "--prompts")
    except (UserError, ValueError) as exc:
        findings.add(str(exc).splitlines(), "--prompts")
    findings.rewards(config.rewards, "evaluation", "rewards")
    for side_of in (pipeline, config.base_pipeline):
        geometry = read_geometry(Path(side_of)) if side_of else None
        if geometry is not None and (problem := geometry.resolution_problem(config.resolution, "resolution")):
            findings.add([problem], "evaluation")
    if outputs:
        findings.add(output_problems(outputs, {**findings.inputs, **(inputs or {})}), "outputs")
    return findings.problems()


def check_or_raise(stages: Sequence[StageConfig], root: str | Path = ".", **options: Any) -> None:
    """:func:`preflight`, raising one :class:`PreflightError` that lists every problem it found."""
    problems = preflight(stages, root, **options)
    if problems:
        raise PreflightError(problems)
