"""A tiny project on disk for stage and flow tests: world prompt files and a tiny embedded pipeline, and the stage
callbacks the tests listen with."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.models.test_embedded import TINY
from vgrpo.config import StageConfig
from vgrpo.training.stage import StageCallbacks, StageResult, run_stage

WORLD_PICK = Path(__file__).parents[1] / "models" / "world-pickscore"
"""The shipped world PickScore: a dense reward, so that groups vary and adapters move."""

TINY_MODEL_PARAMS = {
    "pipeline": "base",
    "eval_prompts": "test.jsonl",
    "rollout": {"prompts_per_iteration": 2, "group_size": 4, "num_steps": 4, "shift": None},
    "lora": {"rank": 4, "alpha": 8, "target_modules": ["to_q", "to_k", "to_v", "to_out.0"]},
    "evaluation": {"group_size": 1, "num_steps": 2, "rewards": [{"name": "geneval"}]},
}
"""A model params file for :func:`write_tiny_world`'s pipeline: stages of seconds."""


def write_tiny_world(root: Path, n_train: int = 40, n_test: int = 8) -> Path:
    """``root/train.jsonl``, ``root/test.jsonl`` and ``root/base`` (a 16 px embedded pipeline); returns root."""
    from vgrpo.models.embedded import build_pipeline, train_clip_tokenizer
    from vgrpo.models.saving import save_pipeline
    from vgrpo.world import make_splits, write_jsonl

    train, test = make_splits(0, n_train, n_test)
    write_jsonl(root / "train.jsonl", [md for md, _ in train])
    write_jsonl(root / "test.jsonl", [md for md, _ in test])
    prompts = [md["prompt"] for md, _ in train + test] + [""]
    save_pipeline(build_pipeline(TINY, train_clip_tokenizer(prompts, TINY), seed=0), root / "base")  # as pretrain
    return root


SWEEP_ABLATIONS = {"no_shared_pairs": "algorithm: {share: none}\n", "v_prediction": "algorithm: {prediction: v}\n"}
"""The two ablation files :func:`write_sweep_project` writes under ``ablations/``."""


def write_sweep_project(root: Path) -> Path:
    """Beside a tiny world in ``root``: a one-stage curriculum ``one.yaml`` (six iterations on world PickScore,
    checkpoints every three) and :data:`SWEEP_ABLATIONS`; returns root."""
    stage = {
        "name": "s1-pick",
        "prompts": "train.jsonl",
        "iterations": 6,
        "checkpoint_every": 3,
        "rewards": [{"name": "pickscore", "options": {"path": str(WORLD_PICK)}}],
        "algorithm": {"name": "vgrpo", "n_mc": 2},
    }
    (root / "base.yaml").write_text("seed: 0\n")
    (root / "model.yaml").write_text(yaml.safe_dump(TINY_MODEL_PARAMS))
    (root / "a.yaml").write_text(yaml.safe_dump(stage))
    curriculum = {"name": "one", "base": ["base.yaml"], "model": "model.yaml", "stages": ["a.yaml"]}
    (root / "one.yaml").write_text(yaml.safe_dump({"curriculum": curriculum}))
    (root / "ablations").mkdir()
    for name, text in SWEEP_ABLATIONS.items():
        (root / "ablations" / f"{name}.yaml").write_text(text)
    return root


def run_sweep_deployment(root: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``prefect deployment run vgrpo-sweep/ablation-sweep`` on :func:`write_sweep_project`'s curriculum and ablations
    in ``root`` (two devices: both cells at once), watched until it ends."""
    params = {
        "curriculum": "one.yaml",
        "root": root,
        "run_root": "runs",
        "devices": 2,
        "ablations": [f"ablations/{name}.yaml" for name in SWEEP_ABLATIONS],
    }
    deployment = "vgrpo-sweep/ablation-sweep"
    cmd = [sys.executable, "-m", "prefect", "deployment", "run", deployment, "--params", json.dumps(params)]
    return subprocess.run(
        [*cmd, "--watch", "--watch-timeout", "600"], env=env, capture_output=True, text=True, timeout=660
    )


def tiny_stage_config(**overrides: object) -> StageConfig:
    """A three-iteration V-GRPO stage on :func:`write_tiny_world`'s files; ``overrides`` replace top-level keys."""
    data: dict = {
        "name": "tiny",
        "prompts": "train.jsonl",
        "iterations": 3,
        "checkpoint_every": 1,
        "rollout": {"prompts_per_iteration": 2, "group_size": 4, "num_steps": 4, "shift": None, "micro_batch_size": 8},
        "optim": {"lr": 1e-2, "micro_batch_size": 8},
        "algorithm": {"name": "vgrpo", "n_mc": 2},
        # One block: SD3's last block has no text-stream output projection (to_add_out).
        "lora": {"rank": 4, "alpha": 8, "target_modules": ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj"]},
        # A continuous reward (the shipped world PickScore) so that groups vary and the adapter moves.
        "rewards": [{"name": "geneval", "weight": 0.5}, {"name": "pickscore", "options": {"path": str(WORLD_PICK)}}],
        "eval_prompts": "test.jsonl",
        "evaluation": {"group_size": 1, "num_steps": 2, "rewards": [{"name": "geneval"}]},
    }
    data.update(overrides)
    return StageConfig.model_validate(data)


def run_tiny_stage(config: StageConfig, world: Path, work: str, out: str, **kwargs: Any) -> StageResult:
    """:func:`run_stage` from :func:`write_tiny_world`'s ``base`` pipeline with ``world`` as the root, working in
    ``world/work`` and exporting to ``world/out``; ``kwargs`` go to :func:`run_stage` as they are."""
    return run_stage(
        config, pipeline_dir=Path("base"), work_dir=world / work, out_dir=world / out, root=world, **kwargs
    )


class Recorder(StageCallbacks):
    """Keeps everything a stage reports, in order."""

    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.evaluated: list[tuple[int, dict[str, Any]]] = []
        self.skips: list[dict[str, Any]] = []
        self.checkpoints: list[tuple[int, Path]] = []

    def on_log(self, metrics: dict[str, float], iteration: int) -> None:
        self.logged.append((iteration, metrics))

    def on_evaluate(self, table: dict[str, Any], images: np.ndarray, iteration: int) -> None:
        self.evaluated.append((iteration, table))

    def on_skip(self, event: dict[str, Any]) -> None:
        self.skips.append(event)

    def on_checkpoint(self, path: Path, iteration: int) -> None:
        self.checkpoints.append((iteration, path))


class Killed(RuntimeError):
    """Raised by :class:`KillAt`."""


class KillAt(StageCallbacks):
    """Kills the stage (raises :class:`Killed`) when it logs ``iteration``: after that iteration's update, before
    its checkpoint, as a crash would leave it."""

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def on_log(self, metrics: dict[str, float], iteration: int) -> None:
        if iteration == self.iteration:
            raise Killed(f"killed after iteration {iteration}'s update")


def run_whole_and_killed(config: StageConfig, world: Path) -> None:
    """``config``'s stage run whole (``world/whole``, exported to ``whole_lora``) and killed after iteration 1's update
    (``world/cut``, nothing exported to ``cut_lora`` yet): what a resumed run in ``cut`` is compared with."""
    run_tiny_stage(config, world, "whole", "whole_lora")
    with pytest.raises(Killed):
        run_tiny_stage(config, world, "cut", "cut_lora", callbacks=KillAt(1))
