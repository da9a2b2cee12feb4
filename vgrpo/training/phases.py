"""The phases of a curriculum stage, each a function with plain inputs and outputs
(:func:`vgrpo.training.stage.run_stage` runs them in a loop; an orchestrator may run each as a task):

* :func:`vgrpo.training.prompt_rows.prepare_prompts` -- read, check and filter the training and evaluation prompt
  rows;
* :func:`setup_policy` -- the pipeline, its LoRA, the optimizer, the algorithm and the rewards (:class:`StagePolicy`);
* :func:`rollout` -> :func:`score` -> :func:`update` -- one iteration (:mod:`vgrpo.training.iteration`);
* :func:`evaluate` / :func:`evaluate_adapter` -- the stage's :class:`vgrpo.evaluation.evaluator.Evaluator`, of
  the policy in memory or of exported weights;
* :func:`export` -- the LoRA in diffusers' format, or the whole pipeline.

With ``ema.enabled`` the stage keeps an EMA of the trainable weights (:class:`vgrpo.training.ema.PolicyEMA`), and
evaluation and export read it instead of the live weights.

Each iteration draws its prompts and its randomness from ``(seed, iteration)`` alone
(:func:`vgrpo.training.prompt_rows.sample_prompt_rows`, :func:`iteration_generator`), so a resumed stage takes the
steps an uninterrupted one takes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.profiler import record_function

from vgrpo.algorithms import Algorithm, build_algorithm
from vgrpo.checkpoints.sharded import export_pipeline
from vgrpo.checkpoints.state import Checkpointed, load_lora_into, save_lora
from vgrpo.config import StageConfig
from vgrpo.evaluation.evaluator import Evaluator
from vgrpo.models import add_lora
from vgrpo.models.pipeline import build_adapter, load_pipeline, place_pipeline
from vgrpo.models.precision import WEIGHT_DTYPES, apply_precision_config, frozen_dtype
from vgrpo.models.registry import family_of
from vgrpo.models.saving import save_pipeline
from vgrpo.parallel.distributed import Distributed, is_sharded
from vgrpo.parallel.fsdp import shard_transformer
from vgrpo.policy import ParameterSnapshot, trainable_parameters
from vgrpo.rewards.base import Metadata, NonFiniteRewardError
from vgrpo.rewards.multi import MultiReward, MultiRewardOutput
from vgrpo.seeding import derive_seed
from vgrpo.training.ema import PolicyEMA, maybe_swapped_in
from vgrpo.training.guards import NonFiniteError
from vgrpo.training.iteration import PHASE_LABEL, RolloutBatch, gather_rewards, rollout_batch, update_policy
from vgrpo.training.optim import build_optimizer
from vgrpo.training.prompt_rows import StagePrompts, evaluation_rows, sample_prompt_rows
from vgrpo.training.replay import ref_kl_weights, sample_replay_rows, unscored_replay
from vgrpo.training.stage_evaluator import build_evaluator

__all__ = [
    "Scores",
    "StagePolicy",
    "StageRollout",
    "evaluate",
    "evaluate_adapter",
    "export",
    "iteration_generator",
    "rollout",
    "score",
    "setup_policy",
    "update",
]


def iteration_generator(seed: int, iteration: int) -> torch.Generator:
    """The torch generator of one iteration: a function of ``(seed, iteration)`` only."""
    return torch.Generator().manual_seed(derive_seed(seed, iteration, 1))


# -- phase: set up the policy ------------------------------------------------------------------------------------------


@dataclass
class StagePolicy:
    """The live objects of a stage: the pipeline's adapter and velocity model (with its LoRA), the optimizer, the
    algorithm, the training rewards, the resolved sampling shift (a number: FLUX's dynamic shift depends on
    the adapter's token count, and the algorithm and the evaluation must build the same sigmas) and the policy's
    EMA when one is kept."""

    pipe: Any
    adapter: Any
    policy: nn.Module
    optimizer: torch.optim.Optimizer
    algorithm: Algorithm
    rewards: MultiReward
    shift: float | None
    dist: Distributed
    ema: PolicyEMA | None = None

    @property
    def transformer(self) -> nn.Module:
        return self.pipe.transformer

    @property
    def sharded(self) -> bool:
        """Whether FSDP shards the transformer over the ranks (:mod:`vgrpo.parallel.fsdp`)."""
        return is_sharded(next(self.transformer.parameters()))

    def snapshots(self) -> dict[str, ParameterSnapshot]:
        """Every weight copy a checkpoint saves besides the policy: the algorithm's, and the EMA."""
        ema = {} if self.ema is None else {PolicyEMA.SNAPSHOT_NAME: self.ema.snapshot}
        return {**self.algorithm.snapshots(), **ema}

    def checkpointed(self) -> Checkpointed:
        """What a training checkpoint of the stage saves and restores."""
        return Checkpointed(module=self.transformer, optimizer=self.optimizer, snapshots=self.snapshots())


def _load_policy(config: StageConfig, pipeline_dir: Path, init_lora: Path | None, dist: Distributed) -> Any:
    # A full fine-tune's previous stage exported a whole pipeline: the stage continues from it, as a LoRA stage
    # continues the previous adapter.
    start = init_lora if config.lora is None and init_lora is not None else pipeline_dir
    pipe = load_pipeline(
        start,
        dtype=WEIGHT_DTYPES[config.precision.lora_base_dtype],
        frozen_dtype=frozen_dtype(config.precision.frozen_dtype, dist.device),
    )
    if config.lora is None:
        pipe.transformer.requires_grad_(True)
        if config.distributed.strategy == "fsdp" and dist.world_size > 1:  # before moving: one block at a time moves
            shard_transformer(pipe.transformer, dist)
    pipe = place_pipeline(pipe, dist.device, text_encoders=config.precision.text_encoders)
    adapter, policy = build_adapter(
        pipe, resolution=config.rollout.resolution, precision=config.precision, num_frames=config.rollout.num_frames
    )
    transformer = pipe.transformer
    if config.lora is not None:
        with torch.random.fork_rng():  # LoRA A is drawn from the global RNG: seed it, or runs differ
            torch.manual_seed(derive_seed(config.seed, 2))
            add_lora(
                transformer,
                rank=config.lora.rank,
                alpha=config.lora.alpha,
                target_modules=config.lora.targets(family_of(pipe).lora_targets),
                dropout=config.lora.dropout,
            )
        if init_lora is not None:
            load_lora_into(transformer, init_lora)
    policy = apply_precision_config(policy, transformer, config.precision)
    return pipe, adapter, policy


def setup_policy(
    config: StageConfig,
    pipeline_dir: Path,
    init_lora: Path | None,
    dist: Distributed,
    rewards: MultiReward | None = None,
) -> StagePolicy:
    """Load the pipeline on ``dist``'s device, add the LoRA (seeded; from ``init_lora`` when given), and build the
    optimizer, the algorithm (on the resolved sigma grid), the training rewards (``rewards`` when given, else
    from ``config.rewards``) and, with ``ema.enabled``, the policy's EMA (starting at the initial weights)."""
    pipe, adapter, policy = _load_policy(config, pipeline_dir, init_lora, dist)
    shift = adapter.sigma_shift(
        config.rollout.shift, dynamic=config.rollout.dynamic_shift, num_steps=config.rollout.num_steps
    )
    algorithm = build_algorithm(config, policy=policy, latent_shape=adapter.latent_shape, shift=shift, dist=dist)
    if rewards is None:
        rewards = MultiReward.from_configs(config.rewards)
    ema = PolicyEMA(trainable_parameters(policy), config.ema) if config.ema.enabled else None
    return StagePolicy(
        pipe=pipe,
        adapter=adapter,
        policy=policy,
        optimizer=build_optimizer(policy, config.optim),
        algorithm=algorithm,
        rewards=rewards,
        shift=shift,
        dist=dist,
        ema=ema,
    )


# -- phases of an iteration: rollout -> score -> update ----------------------------------------------------------------


@dataclass
class StageRollout:
    """The rollout phase's output: the samples (in memory), this rank's prompt rows, one per sample, and how many
    of its samples lead its block as the stage's own (the rest replay: :mod:`vgrpo.training.replay`)."""

    batch: RolloutBatch
    sample_rows: list[Metadata]
    own_samples: int


def rollout(stage: StagePolicy, config: StageConfig, prompts: StagePrompts, iteration: int) -> StageRollout:
    """Draw the iteration's prompts (and its replay prompts after them) from ``(seed, iteration)``, encode them and
    sample ``group_size`` images each under the behaviour policy."""
    drawn = sample_prompt_rows(
        prompts.train, config.rollout.prompts_per_iteration, config.seed, iteration, config.prompt_tag_weights
    )
    replay, weights = config.replay, None
    if replay is not None:
        replayed = sample_replay_rows(prompts.replay, replay.prompts_per_iteration, config.seed, iteration)
        tags = [str(r.get("tag")) for r in replayed]
        weights = ref_kl_weights(replay, tags, len(drawn), config.rollout.group_size)
        drawn = [*drawn, *replayed]
    texts = [str(r["prompt"]) for r in drawn]
    shard = stage.dist.shard(len(texts))
    group_size = config.rollout.group_size
    batch = rollout_batch(
        policy=stage.policy,
        algorithm=stage.algorithm,
        prompts=texts,
        cond=stage.adapter.encode_rows(drawn),  # the rows: an editing family's name its condition images
        minibatches=config.optim.minibatches,
        latent_shape=stage.adapter.latent_shape,
        generator=iteration_generator(config.seed, iteration),
        iteration=iteration,
        group_noise=config.rollout.group_noise,
        replay_groups=len(drawn) - config.rollout.prompts_per_iteration,
        ref_kl_weights=weights,
    )
    own = max(0, min(shard.stop, config.rollout.prompts_per_iteration) - shard.start) * group_size
    return StageRollout(batch=batch, sample_rows=[r for r in drawn[shard] for _ in range(group_size)], own_samples=own)


@dataclass
class Scores:
    """The score phase's output: the global batch's rewards ``{key: (N,)}`` and their metrics."""

    rewards: dict[str, torch.Tensor]
    metrics: dict[str, float]
    seconds: float


def score(stage: StagePolicy, rolled: StageRollout) -> Scores:
    """Decode this rank's own samples (not its replay samples) and score them with every training reward; gather
    the scores of all ranks.

    A reward that returns NaN or Inf on any rank stops the phase on every rank with
    :class:`vgrpo.training.guards.NonFiniteError` naming the reward (a flag reduced over ranks, so all ranks skip)."""
    t0 = time.perf_counter()
    rewards, out, failure, own = stage.rewards, None, None, rolled.own_samples
    with record_function(PHASE_LABEL["reward"]):
        if own:
            with torch.no_grad():
                images = stage.adapter.decode_samples(rolled.batch.rollout.samples[:own])  # a video's: frames
            rows = rolled.sample_rows[:own] if rewards.needs_metadata else None
            try:
                out = rewards(images, rolled.batch.sample_prompts[:own], rows)
            except NonFiniteRewardError as exc:
                failure = exc
    if stage.dist.any(failure is not None):
        quantity = failure.quantity if failure is not None else "reward (on another rank)"
        details = failure.details if failure is not None else {}
        raise NonFiniteError(
            quantity,
            {**details, "rank": stage.dist.rank, "reward_errors": [str(failure)] if failure is not None else []},
        )
    local = {} if out is None else out.score_tensors()
    if len(rolled.sample_rows) > own:
        local = unscored_replay(local, list(rewards.terms), len(rolled.sample_rows))
    gathered = gather_rewards(rolled.batch, local, stage.dist)
    # Sub-scores of the whole batch: a rank's chunk may lack a sub-score (NaN there), so join, then average.
    local_times = {} if out is None else {k: v for k, v in out.metrics().items() if k.startswith("time/")}
    parts = [part for part in stage.dist.gather_object(out) if part is not None]
    metrics = MultiRewardOutput.concatenate(parts).metrics() | local_times
    return Scores(rewards=gathered, metrics=metrics, seconds=time.perf_counter() - t0)


def update(
    stage: StagePolicy, config: StageConfig, rolled: StageRollout, scores: Scores, iteration: int
) -> dict[str, float]:
    """Advantages from the scores (weighted by the rewards' weights), then the algorithm's gradient steps and the
    EMA's update; returns the iteration's metrics."""
    record = update_policy(
        policy=stage.policy,
        algorithm=stage.algorithm,
        optimizer=stage.optimizer,
        batch=rolled.batch,
        rewards=scores.rewards,
        advantage=config.advantage,
        optim=config.optim,
        reward_weights=stage.rewards.weights,
        reward_seconds=scores.seconds,
    )
    ema = stage.ema.step(iteration) if stage.ema is not None else {}
    return {**record.metrics, **scores.metrics, **ema}


# -- phase: evaluate ---------------------------------------------------------------------------------------------------


def evaluate(stage: StagePolicy, evaluator: Evaluator, iteration: int) -> tuple[dict[str, Any], np.ndarray]:
    """The evaluation of the stage's policy in memory: its EMA when one is kept, else the live weights."""
    with maybe_swapped_in(stage.ema):
        return evaluator(stage.adapter, stage.policy, iteration)


def evaluate_adapter(
    config: StageConfig, pipeline_dir: Path, adapter_dir: Path | None, root: Path, iteration: int
) -> tuple[dict[str, Any], np.ndarray] | None:
    """The evaluation of exported weights (``adapter_dir``: a LoRA on ``pipeline_dir``; ``None``: the pipeline
    itself) under the stage's evaluation settings (its resolution and shift:
    :class:`vgrpo.evaluation.evaluator.Evaluator`
    resizes the adapter and resolves the shift from the rollout's rule); ``None`` without evaluation prompts. The
    same numbers as evaluating the trained policy in memory, so an evaluation can be redone (or cached) without
    training."""
    rows = evaluation_rows(config, root)  # not the training prompts: nothing here reads them
    if rows is None:
        return None
    dist = Distributed()
    if config.lora is None and adapter_dir is not None:
        pipeline_dir, adapter_dir = adapter_dir, None  # a full fine-tune exports a whole pipeline
    _, adapter, policy = _load_policy(config, pipeline_dir, adapter_dir, dist)
    shift = adapter.sigma_shift(
        config.rollout.shift, dynamic=config.rollout.dynamic_shift, num_steps=config.rollout.num_steps
    )
    evaluator = build_evaluator(config, rows, root, shift, dist)
    return None if evaluator is None else evaluator(adapter, policy, iteration)


# -- phase: export -----------------------------------------------------------------------------------------------------


def export(stage: StagePolicy, config: StageConfig, out_dir: Path) -> Path:
    """Write the trained weights (the EMA when one is kept) to ``out_dir`` atomically (rank 0): the LoRA in
    diffusers' format, or the whole pipeline after a full fine-tune (sharded: gathered on rank 0 from every rank)."""
    if stage.sharded:
        with maybe_swapped_in(stage.ema):
            export_pipeline(stage.pipe, stage.dist, out_dir)
    elif stage.dist.is_main:
        with maybe_swapped_in(stage.ema):
            if config.lora is not None:
                save_lora(stage.transformer, out_dir)
            else:
                save_pipeline(stage.pipe, out_dir)
    stage.dist.barrier()  # every rank returns once the export exists
    return out_dir
