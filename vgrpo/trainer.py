"""One stage of V-GRPO (or a baseline) as one object, as trl's ``GRPOTrainer``: built from params files or from
Python objects, with :meth:`Trainer.train`, :meth:`Trainer.evaluate` and :meth:`Trainer.export`.

The Prefect tasks, DVC's stages and ``vgrpo train`` all go through it, so the API a user scripts against is
the one the pipeline runs::

    trainer = Trainer.from_params("params/base.yaml", "params/models/sd35.yaml", "params/stages/sd35/1-preference.yaml",
                                  pipeline="/models/stable-diffusion-3.5-medium", rewards={"mine": my_reward},
                                  work_dir="runs/mine")
    trainer.train()
    table, images = trainer.evaluate()
    trainer.export("runs/mine/merged", merged=True)
"""

from __future__ import annotations

import inspect
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from vgrpo.atomic import atomic_dir
from vgrpo.checkpoints.state import LORA_FILE, export_merged_pipeline, lora_scale_problem
from vgrpo.checkpoints.weight_files import adapter_fit_problems, transformer_shapes
from vgrpo.config import StageConfig, load_config, load_curriculum
from vgrpo.errors import ConfigError
from vgrpo.models.pipeline import load_pipeline
from vgrpo.outputs import Output, check_outputs
from vgrpo.parallel.distributed import Distributed
from vgrpo.rewards.base import Reward
from vgrpo.rewards.config import RewardConfig
from vgrpo.rewards.multi import MultiReward, RewardTerm
from vgrpo.rewards.registry import FunctionReward, refuse_reward_class
from vgrpo.training.phases import evaluate_adapter
from vgrpo.training.preflight import check_or_raise
from vgrpo.training.stage import (
    FanOut,
    PhaseRunner,
    ProgressView,
    StageCallbacks,
    StageOptions,
    StageResult,
    call_directly,
    run_stage,
)

__all__ = ["RewardLike", "Trainer", "export_lora_merged"]

RewardLike = Reward | Callable[..., Any] | RewardTerm
"""A reward given as an object: a :class:`Reward`, a reward function (``fn(images, prompts, metadata)`` ->
``N`` scores, as trl's ``reward_funcs``), or a :class:`RewardTerm` carrying its weight and normalisation."""


def _import_path(obj: Any) -> str:
    """``module:qualname`` of a reward's class or function: its name in the stage's params and checkpoints."""
    target = obj if inspect.isfunction(obj) else type(obj)
    return f"{target.__module__}:{target.__qualname__}"


def _reward_set(config: StageConfig, rewards: Mapping[str, RewardLike]) -> tuple[StageConfig, MultiReward]:
    """The rewards as a :class:`MultiReward`, and ``config`` with ``rewards`` naming them, so the training
    fingerprint (which decides what a checkpoint may resume) and the tracked params say which rewards trained."""
    if not isinstance(rewards, Mapping):  # trl's reward_funcs is a list; here each reward needs its key
        raise ConfigError(f"rewards: a mapping of key -> reward ({{'mine': MyReward()}}), got {type(rewards).__name__}")
    if not rewards:
        raise ConfigError("rewards: give at least one reward")
    terms: dict[str, RewardTerm] = {}
    specs: list[RewardConfig] = []
    for key, given in rewards.items():
        refuse_reward_class(given, f"rewards[{key!r}]")
        try:
            term = (
                given
                if isinstance(given, RewardTerm)
                else RewardTerm(given if isinstance(given, Reward) else FunctionReward(given, key))
            )
        except TypeError as exc:  # a function no caller can call (vgrpo.rewards.registry.function_style)
            raise ConfigError(f"rewards[{key!r}]: {exc}") from exc
        inner = term.reward.fn if isinstance(term.reward, FunctionReward) else term.reward
        name = _import_path(inner)
        if "<lambda>" in name:
            raise ConfigError(
                f"rewards[{key!r}]: {name} is a lambda, which no import path reaches; the stage's params and "
                "checkpoints name each reward by its import path, so define it with def at module level"
            )
        if "<" in name:  # <locals>: no import path reaches it
            raise ConfigError(
                f"rewards[{key!r}]: {name} is defined inside a function; define the reward at module "
                "level, so the stage's params and checkpoints can name it"
            )
        try:
            spec = RewardConfig(name=name, key=key, weight=term.weight, offset=term.offset, scale=term.scale)
        except ValidationError as exc:
            raise ConfigError(f"rewards[{key!r}]: {exc.errors()[0]['msg']}") from exc
        terms[key] = term
        specs.append(spec)
    try:
        return StageConfig.model_validate({**config.model_dump(), "rewards": specs}), MultiReward(terms)
    except ValidationError as exc:
        raise ConfigError(f"rewards: {exc.errors()[0]['msg']}") from exc


@dataclass
class Trainer:
    """A curriculum stage: train from ``pipeline`` (+ ``init_lora``, a previous stage's adapter), evaluate, export.

    Relative paths (``pipeline``, ``init_lora``, the prompt files in ``config``) are resolved against ``root``.
    Checkpoints go to ``work_dir/checkpoints`` (a run resumes the newest one written with the same training
    params and starting adapter); the trained weights are exported to ``out_dir`` (default ``work_dir/export``).

    Attributes:
        rewards: the training rewards as objects; when given, the config's ``rewards`` are set to name them
            (``module:qualname``, so a checkpoint never resumes under other rewards). An object's own settings
            (a Reward's constructor arguments) are not part of that name: give the reward another key when you
            change them mid-run.
        callbacks: what the stage reports (rank 0) and what steers it (every rank): a
            :class:`vgrpo.training.stage.StageCallbacks`, or several in a list (``docs/extending.md``: early stopping).
        progress: show the live progress line on stderr while training (:class:`vgrpo.training.stage.ProgressView`:
            iteration i of m, seconds per iteration, ETA, the last rewards), beside ``callbacks``.
        phases: how each phase runs (:data:`vgrpo.training.stage.PhaseRunner`; the Prefect layer runs each as a task).
        dist: the processes sharing each iteration (default: from ``accelerate launch``'s environment).
    """

    config: StageConfig
    work_dir: Path
    pipeline: Path | None = None
    out_dir: Path | None = None
    init_lora: Path | None = None
    root: Path = Path(".")
    rewards: Mapping[str, RewardLike] | None = None
    callbacks: StageCallbacks | Sequence[StageCallbacks] | None = None
    progress: bool = False
    phases: PhaseRunner = call_directly
    dist: Distributed | None = None
    reward_set: MultiReward | None = field(default=None, init=False, repr=False)
    checked: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.work_dir, self.root = Path(self.work_dir), Path(self.root)
        self.pipeline = Path(self.pipeline if self.pipeline is not None else self.config.pipeline)
        self.out_dir = Path(self.out_dir) if self.out_dir is not None else self.work_dir / "export"
        self.init_lora = Path(self.init_lora) if self.init_lora is not None else None
        if self.rewards is not None:
            self.config, self.reward_set = _reward_set(self.config, self.rewards)

    @classmethod
    def from_params(cls, *params: str | Path, overrides: Mapping[str, Any] | None = None, **kwargs: Any) -> Trainer:
        """A trainer from params files merged in order (``base -> model -> stage``) and ``overrides``
        (``{"optim": {"lr": 1e-4}}``); ``kwargs`` are :class:`Trainer`'s fields."""
        return cls(config=load_config(list(params), overrides, schema=StageConfig), **kwargs)

    @classmethod
    def from_curriculum(
        cls, path: str | Path, stage: str | int, *, overrides: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> Trainer:
        """A trainer for one stage of a curriculum file, by name or 1-based position."""
        _, stages = load_curriculum(path, overrides, root=kwargs.get("root", "."))
        chosen = [s for i, s in enumerate(stages, 1) if stage in (s.name, i)]
        if not chosen:
            raise ConfigError(f"{path}: no stage {stage!r} (stages: {[s.name for s in stages]})")
        return cls(config=chosen[0], **kwargs)

    def preflight(
        self,
        *,
        labels: tuple[str, str] = ("out_dir", "work_dir"),
        outputs: Sequence[Output] = (),
        inputs: Mapping[str, str | Path] | None = None,
    ) -> None:
        """Check, before any compute, every input the stage reads (:func:`vgrpo.training.preflight.preflight`: the
        pipeline, prompt files, rewards, starting adapter, image sides, processes, disk) and every output it writes
        (``out_dir`` and ``work_dir``, named ``labels`` in messages, and ``outputs``: none may overwrite an input,
        ``inputs`` such as the params files included, or another output; each must be writable). :meth:`train` runs
        it first unless it has passed already.

        Raises:
            PreflightError: listing every problem found, each naming its file, folder or key.
        """
        assert self.pipeline is not None and self.out_dir is not None
        config = self.config
        if str(self.pipeline) != config.pipeline:
            config = config.model_copy(update={"pipeline": str(self.pipeline)})
        world_size = self.dist.world_size if self.dist is not None else int(os.environ.get("WORLD_SIZE", "1"))
        written = [Output(labels[0], self.out_dir), Output(labels[1], self.work_dir, replaced=False), *outputs]
        check_or_raise(
            [config],
            self.root,
            init_lora=self.init_lora,
            world_size=world_size,
            checkpoint_dir=self.work_dir,
            outputs=written,
            inputs=inputs,
        )
        self.checked = True

    def train(
        self,
        *,
        final_evaluation: bool = True,
        run_state: Mapping[str, Any] | None = None,
        prompts: Any = None,
    ) -> StageResult:
        """Train the stage (resuming its newest checkpoint) and export the weights to ``out_dir``, after
        :meth:`preflight`; see :class:`vgrpo.training.stage.StageOptions` for ``final_evaluation``, ``run_state``
        and ``prompts``."""
        assert self.pipeline is not None and self.out_dir is not None
        if not self.checked:
            self.preflight()
        callbacks = FanOut(*self.callbacks) if isinstance(self.callbacks, Sequence) else self.callbacks
        if self.progress:
            view = ProgressView(self.config.name, self.config.iterations)
            callbacks = view if callbacks is None else FanOut(callbacks, view)
        return run_stage(
            self.config,
            pipeline_dir=self.pipeline,
            work_dir=self.work_dir,
            out_dir=self.out_dir,
            init_lora=self.init_lora,
            root=self.root,
            callbacks=callbacks,
            options=StageOptions(
                phases=self.phases,
                final_evaluation=final_evaluation,
                run_state=run_state,
                prompts=prompts,
                rewards=self.reward_set,
                dist=self.dist,
            ),
        )

    def evaluate(
        self, weights: str | Path | None = None, iteration: int | None = None
    ) -> tuple[dict[str, Any], np.ndarray] | None:
        """The stage's evaluation (its ``evaluation`` settings and ``eval_prompts``) of exported weights: ``weights``
        (a LoRA directory, or a whole pipeline after full fine-tuning), by default ``out_dir``; returns the table
        and the images, or ``None`` without evaluation prompts."""
        assert self.pipeline is not None
        target = Path(weights) if weights is not None else self.out_dir
        if target is None or not target.is_dir():
            raise ConfigError(f"{target}: no exported weights to evaluate (train first, or pass weights=)")
        done = self.config.iterations if iteration is None else iteration
        return evaluate_adapter(self.config, self.root / self.pipeline, target, self.root, done)

    def export(self, out_dir: str | Path, *, merged: bool = False, lora_scale: float = 1.0) -> Path:
        """Write the trained weights to ``out_dir``: the LoRA in diffusers' format (or the whole pipeline after
        full fine-tuning), or with ``merged`` a plain diffusers pipeline with the LoRA fused in at ``lora_scale``.
        ``out_dir`` may not be, contain or lie inside the pipeline, the starting adapter or the trained weights."""
        assert self.pipeline is not None and self.out_dir is not None
        source, target = self.out_dir, Path(out_dir)
        if not source.is_dir():
            raise ConfigError(f"{source}: no exported weights (train first)")
        inputs = {"pipeline": self.root / self.pipeline, "starting adapter": self.init_lora, "trained weights": source}
        check_outputs([Output("out_dir", target)], inputs)
        if merged and self.config.lora is not None:
            export_lora_merged(self.root / self.pipeline, source, target, lora_scale=lora_scale)
        else:

            def copy(tmp: Path) -> None:
                shutil.copytree(source, tmp, dirs_exist_ok=True)

            atomic_dir(target, copy)
        return target


def export_lora_merged(pipeline: Path, lora: Path, out_dir: Path, *, lora_scale: float = 1.0) -> None:
    """``lora`` fused into ``pipeline`` at ``lora_scale`` and written to ``out_dir``
    (:func:`vgrpo.checkpoints.state.export_merged_pipeline`), after checking, before the pipeline loads, the scale
    and that every layer of the adapter fits the pipeline's transformer.

    Raises:
        ConfigError: the scale or the adapter, named.
    """
    problem = lora_scale_problem(lora_scale)
    if problem:
        raise ConfigError(problem)
    shapes = transformer_shapes(pipeline)
    misfit = adapter_fit_problems(lora, shapes=shapes) if (lora / LORA_FILE).is_file() else []
    if misfit:
        raise ConfigError("; ".join(misfit))
    export_merged_pipeline(load_pipeline(pipeline), lora, out_dir, lora_scale=lora_scale)
