"""One curriculum stage as plain functions: load -> (resume) -> iterate -> checkpoint -> evaluate -> export.

Each iteration draws its prompts and its randomness (initial noise, SDE noise, pairs, minibatches) from
``(seed, iteration)`` alone, so a stage resumed from a checkpoint takes exactly the steps an uninterrupted
run takes. The orchestration (Prefect tasks, MLflow) plugs in through the ``log`` and ``on_eval`` callbacks;
this module imports neither.

Sharded over processes (``dist``, :mod:`vgrpo.distributed`), every rank trains on its block of each
iteration's prompts, and rank 0 alone logs, evaluates, writes checkpoints and exports; every rank resumes
from the checkpoint rank 0 picked (``work_dir`` must be on a filesystem every node sees).
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vgrpo.algorithms import build_algorithm
from vgrpo.atomic import atomic_dir
from vgrpo.checkpoint import (
    LORA_FILE,
    CheckpointError,
    checkpoints,
    load_lora_into,
    load_training_state,
    prune_checkpoints,
    quarantine,
    save_lora,
    save_training_state,
)
from vgrpo.config import RewardConfig, StageConfig
from vgrpo.distributed import Distributed, samples_per_process
from vgrpo.guards import NonFiniteError, TrainingDiverged
from vgrpo.models import add_lora
from vgrpo.models.precision import apply_precision
from vgrpo.policy import trainable_parameters
from vgrpo.prompts import check_geneval_metadata, load_prompts
from vgrpo.rewards.base import Metadata, NonFiniteRewardError
from vgrpo.rewards.multi import MultiReward, MultiRewardOutput
from vgrpo.train_step import build_optimizer, train_iteration

__all__ = ["StageResult", "iteration_generator", "run_stage", "sample_prompt_rows"]

MetricsLog = Callable[[dict[str, float], int], None]
SkipHook = Callable[[dict[str, Any]], None]
EvalHook = Callable[[dict[str, Any], np.ndarray, int], None]


@dataclass
class StageResult:
    """What a finished stage leaves: the exported weights and what was measured on the way."""

    out_dir: Path
    iterations: int
    history: list[dict[str, float]] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)
    """One event per iteration skipped for a non-finite quantity (:mod:`vgrpo.guards`)."""


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1, dtype=np.uint64)[0] >> 1)


def iteration_generator(seed: int, iteration: int) -> torch.Generator:
    """The torch generator of one iteration: a function of ``(seed, iteration)`` only."""
    return torch.Generator().manual_seed(_seed(seed, iteration, 1))


def sample_prompt_rows(
    rows: Sequence[Metadata],
    count: int,
    seed: int,
    iteration: int,
    tag_weights: Mapping[str, float] | None = None,
) -> list[Metadata]:
    """``count`` prompt rows for one iteration, without replacement when there are enough. With ``tag_weights``
    each row's probability is its tag's weight shared among the tag's rows (every row's tag needs a weight)."""
    rng = np.random.default_rng(_seed(seed, iteration, 0))
    p = None
    if tag_weights is not None:
        tags = [str(r.get("tag")) for r in rows]
        per_tag = Counter(tags)
        p = np.array([tag_weights[t] / per_tag[t] for t in tags])
        p = p / p.sum()
    idx = rng.choice(len(rows), size=count, replace=len(rows) < count, p=p)
    return [rows[int(i)] for i in idx]


def adapter_hash(lora_dir: Path) -> str:
    """SHA-256 (16 hex digits) of a LoRA directory's weights file: the identity of a stage's starting adapter."""
    return hashlib.sha256((lora_dir / LORA_FILE).read_bytes()).hexdigest()[:16]


def config_hash(config: StageConfig) -> str:
    """Fingerprint of everything that decides the stage's steps (a checkpoint from other params is not resumed)."""
    return hashlib.sha256(json.dumps(config.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]


def _uses_geneval(rewards: Sequence[RewardConfig]) -> bool:
    """Whether a reward set reads GenEval clauses (so its prompt file's clauses are checked before compute)."""
    return any(r.name in ("geneval", "geneval_server") for r in rewards)


def _rows(config: StageConfig, root: Path) -> list[dict[str, Any]]:
    rows = load_prompts(root / config.prompts)
    if _uses_geneval(config.rewards):
        check_geneval_metadata(rows, root / config.prompts)
    if config.prompt_tags is not None:
        rows = [r for r in rows if r.get("tag") in config.prompt_tags]
        if not rows:
            raise ValueError(f"{config.prompts}: no prompt has a tag in prompt_tags={list(config.prompt_tags)}")
    if config.prompt_tag_weights is not None:
        unweighted = sorted({str(r.get("tag")) for r in rows} - set(config.prompt_tag_weights))
        if unweighted:
            raise ValueError(
                f"{config.prompts}: prompt_tag_weights has no weight for the tags {unweighted} "
                "(give them one, or leave them out with prompt_tags)"
            )
    return rows


def run_stage(
    config: StageConfig,
    *,
    pipeline_dir: Path,
    work_dir: Path,
    out_dir: Path,
    init_lora: Path | None = None,
    root: Path = Path("."),
    log: MetricsLog | None = None,
    on_eval: EvalHook | None = None,
    on_skip: SkipHook | None = None,
    dist: Distributed | None = None,
) -> StageResult:
    """Train one stage from ``pipeline_dir`` (+ ``init_lora``, the previous stage's adapter) and export its
    LoRA to ``out_dir``. Checkpoints go to ``work_dir/checkpoints``; a run finds the newest one written with the
    same params and continues from it.

    Args:
        root: folder that relative prompt and model paths in ``config`` are resolved against.
        log: called with each iteration's flat metrics (rewards, every sub-score, surrogate CV, ratio and
            clip statistics, KL, grad norm, seconds per phase) and the iteration number.
        on_eval: called with each evaluation table, its images and the iteration.
        on_skip: called with the event of each iteration skipped for a NaN or Inf (reward, advantage, surrogate,
            loss or gradient: which, how many, where); after ``max_consecutive_skips`` in a row the stage raises
            :class:`vgrpo.guards.TrainingDiverged` and leaves its last checkpoint as it was.
        dist: the processes sharing each iteration's batch (default: from the environment ``accelerate launch``
            sets, else one process, on the GPU when there is one); ``log``, ``on_eval``, checkpoints and the export
            happen on rank 0 only (the returned history is every rank's, evaluations rank 0's).
    """
    from vgrpo.evaluation import evaluate
    from vgrpo.images import tensor_to_images
    from vgrpo.models.pipeline import build_adapter, load_pipeline

    dist = dist if dist is not None else Distributed.from_environment()
    rollout = config.rollout  # 1. validate inputs before any compute
    samples_per_process(rollout.prompts_per_iteration, rollout.group_size, config.optim.minibatches, dist.world_size)
    shard = dist.shard(rollout.prompts_per_iteration)
    rows = _rows(config, root)
    eval_rows = load_prompts(root / config.eval_prompts) if config.eval_prompts else None
    if eval_rows and _uses_geneval(config.evaluation.rewards):
        check_geneval_metadata(eval_rows, root / str(config.eval_prompts))
    eval_rows = eval_rows[: config.evaluation.max_prompts] if eval_rows else None
    pipe = load_pipeline(root / pipeline_dir).to(dist.device)  # 2. model, adapter, optimizer, algorithm
    adapter, policy = build_adapter(pipe, resolution=config.rollout.resolution)
    transformer = pipe.transformer
    if config.lora is None:
        transformer.requires_grad_(True)
    else:
        with torch.random.fork_rng():  # LoRA A is drawn from the global RNG: seed it, or runs differ
            torch.manual_seed(_seed(config.seed, 2))
            add_lora(transformer, rank=config.lora.rank, alpha=config.lora.alpha,
                     target_modules=config.lora.target_modules, dropout=config.lora.dropout)  # fmt: skip
        if init_lora is not None:
            load_lora_into(transformer, root / init_lora)
    policy = apply_precision(policy, transformer, autocast=config.precision.autocast,
                             gradient_checkpointing=config.precision.gradient_checkpointing)  # fmt: skip
    # The sampling grid's shift as a number (FLUX's dynamic shift depends on the adapter's token count), so the
    # algorithm and the evaluation build the same sigmas.
    shift = adapter.sigma_shift(config.rollout.shift, dynamic=config.rollout.dynamic_shift)
    rollout = config.rollout.model_copy(update={"shift": shift, "dynamic_shift": False})
    optimizer = build_optimizer(policy, config.optim)
    rewards = MultiReward.from_specs([r.model_dump() for r in config.rewards])
    eval_rewards = MultiReward.from_specs([r.model_dump() for r in config.evaluation.rewards]) if eval_rows else None
    # The stage weights its rewards on the reward entries; train_iteration reads them from advantage.weights.
    train_config = config.model_copy(
        update={"advantage": config.advantage.model_copy(update={"weights": rewards.weights}), "rollout": rollout}
    )
    algorithm = build_algorithm(train_config, policy=policy, latent_shape=adapter.latent_shape, dist=dist)

    # 3. resume: only from a checkpoint of the same params and the same starting adapter, by content (a previous
    # stage re-run with other params rewrites its adapter at the same path)
    ckpt_root, fingerprint = work_dir / "checkpoints", config_hash(config)
    init_hash = adapter_hash(root / init_lora) if init_lora is not None else None
    result = StageResult(out_dir=out_dir, iterations=config.iterations)

    def same_run(checkpoint: Path) -> bool:
        try:
            state = json.loads((checkpoint / "state.json").read_text())
        except (OSError, ValueError):
            return True  # unreadable: let loading report it and set it aside
        return bool(state.get("config_hash") == fingerprint and state.get("init_lora_hash") == init_hash)

    def resume() -> tuple[Path, dict[str, Any]] | None:
        """Rank 0: load the newest checkpoint of this run that loads whole, setting corrupt ones aside."""
        for candidate in (c for c in checkpoints(ckpt_root) if same_run(c)):
            try:
                return candidate, load_training_state(candidate, module=transformer, optimizer=optimizer,
                                                      snapshots=algorithm.snapshots())  # fmt: skip
            except CheckpointError as exc:
                moved = quarantine(candidate)
                warnings.warn(f"{exc}; moved to {moved.name}, resuming from an older checkpoint", stacklevel=2)
        return None

    found = resume() if dist.is_main else None
    path = dist.broadcast_object(None if found is None else found[0])
    resumed: dict[str, Any] | None = None
    if path is not None:  # the other ranks load what rank 0 loaded (optimizer state and snapshots included)
        resumed = found[1] if found is not None else load_training_state(
            path, module=transformer, optimizer=optimizer, snapshots=algorithm.snapshots())  # fmt: skip
        result.history, result.evaluations = resumed["history"], resumed["evaluations"]
        result.skipped = resumed.get("skipped", [])
        result.resumed_from = int(resumed["iteration"])
    consecutive_skips = int(resumed.get("consecutive_skips", 0)) if resumed is not None else 0
    dist.broadcast_parameters(trainable_parameters(policy))  # as DDP does: every rank starts from rank 0's weights

    base_policy = None  # hybrid sampling (FLUX evaluation, p_mix): the base finishes the last steps
    if config.evaluation.base_pipeline is not None and eval_rows is not None and dist.is_main:
        base_pipe = load_pipeline(root / config.evaluation.base_pipeline).to(dist.device)
        base_policy = build_adapter(base_pipe, resolution=config.rollout.resolution)[1].eval()

    def run_evaluation(iteration: int) -> None:
        if eval_rows is None or eval_rewards is None or not dist.is_main:  # the other ranks go on to wait in
            return  # the next iteration's first collective (within the process group's timeout)
        ev = config.evaluation
        table, images = evaluate(
            adapter=adapter, policy=policy, metadata=eval_rows, rewards=eval_rewards, group_size=ev.group_size,
            num_steps=ev.num_steps, seed=ev.seed, shift=shift, guidance_scale=ev.guidance_scale,
            base=base_policy, p_mix=ev.p_mix, micro_batch=ev.micro_batch,
        )  # fmt: skip
        table["iteration"] = iteration
        result.evaluations.append(table)
        if on_eval is not None:
            on_eval(table, images, iteration)

    if result.resumed_from == 0 and config.eval_every and config.eval_at_start:
        run_evaluation(0)
    for iteration in range(result.resumed_from, config.iterations):  # 4. iterate
        batch = sample_prompt_rows(
            rows, config.rollout.prompts_per_iteration, config.seed, iteration, config.prompt_tag_weights
        )
        prompts = [str(r["prompt"]) for r in batch]
        expanded = [r for r in batch[shard] for _ in range(config.rollout.group_size)]  # this rank's samples
        scored: list[MultiRewardOutput] = []
        reward_errors: list[str] = []

        def reward_fn(samples: Tensor, sample_prompts: Sequence[str], expanded: list[Metadata] = expanded,
                      scored: list[MultiRewardOutput] = scored,
                      reward_errors: list[str] = reward_errors) -> dict[str, Tensor]:  # fmt: skip
            with torch.no_grad():
                images = tensor_to_images(adapter.decode(samples))
            try:
                out = rewards(images, list(sample_prompts), expanded if rewards.needs_metadata else None)
            except NonFiniteRewardError as exc:  # NaN scores for that reward, so that train_iteration's check
                reward_errors.append(str(exc))  # (on the scores gathered from every rank) skips on all ranks
                n = samples.shape[0]
                bad = torch.full((n,), float("nan")) if exc.scores is None else torch.as_tensor(exc.scores)
                return {key: bad.float() if exc.quantity == f"reward/{term.reward.name}" else torch.zeros(n)
                        for key, term in rewards.terms.items()}  # fmt: skip
            scored.append(out)
            return out.score_tensors()

        t0 = time.perf_counter()
        cond = adapter.encode_prompts(prompts)
        try:
            record = train_iteration(
                policy=policy, algorithm=algorithm, optimizer=optimizer, reward_fn=reward_fn, prompts=prompts,
                cond=cond, config=train_config,
                latent_shape=adapter.latent_shape, generator=iteration_generator(config.seed, iteration),
                iteration=iteration,
            )  # fmt: skip
        except NonFiniteError as exc:  # no update was applied after the check failed: skip the iteration
            consecutive_skips += 1
            event = {"iteration": iteration, "quantity": exc.quantity, **exc.details, "consecutive": consecutive_skips,
                     "reward_errors": reward_errors}  # fmt: skip
            result.skipped.append(event)
            metrics = {"iteration": float(iteration), "guard/skipped": 1.0,
                       "guard/consecutive_skips": float(consecutive_skips)}  # fmt: skip
            result.history.append(metrics)
            if dist.is_main:
                if log is not None:
                    log(metrics, iteration)
                if on_skip is not None:
                    on_skip(event)
            if consecutive_skips >= config.max_consecutive_skips:
                kept = next((c for c in checkpoints(ckpt_root) if same_run(c)), None)
                raise TrainingDiverged(
                    f"stage {config.name}: {consecutive_skips} consecutive iterations skipped for non-finite values "
                    f"({', '.join(sorted({e['quantity'] for e in result.skipped[-consecutive_skips:]}))} at "
                    f"iterations {[e['iteration'] for e in result.skipped[-consecutive_skips:]]}); the last "
                    f"checkpoint, {kept if kept is not None else 'none yet'}, is intact. Lower optim.lr, check the "
                    "rewards, or raise max_consecutive_skips."
                ) from exc
        else:
            consecutive_skips = 0
            # Sub-scores of the whole batch: a rank's chunk may lack a sub-score (NaN there), so join, then average.
            local_times = {k: v for k, v in scored[0].metrics().items() if k.startswith("time/")}
            scores = MultiRewardOutput.concatenate(dist.gather_object(scored[0])).metrics() | local_times
            metrics = {**record.metrics, **scores, "guard/skipped": 0.0, "time/iteration_s": time.perf_counter() - t0}
            result.history.append(metrics)
            if log is not None and dist.is_main:
                log(metrics, iteration)
        done = iteration + 1
        if config.eval_every and done % config.eval_every == 0 and done < config.iterations:
            run_evaluation(done)
        if done % config.checkpoint_every == 0 or done == config.iterations:  # 5. checkpoint (rank 0 writes)
            if dist.is_main:
                state = {"iteration": done, "config_hash": fingerprint, "init_lora": str(init_lora),
                         "init_lora_hash": init_hash, "history": result.history,
                         "evaluations": result.evaluations, "skipped": result.skipped,
                         "consecutive_skips": consecutive_skips}  # fmt: skip
                save_training_state(ckpt_root / f"iter-{done}", module=transformer, optimizer=optimizer,
                                    snapshots=algorithm.snapshots(), state=state)  # fmt: skip
                prune_checkpoints(ckpt_root, config.keep_checkpoints, same_run=same_run)
            dist.barrier()  # the checkpoint is whole before any rank goes on
    if not result.evaluations or result.evaluations[-1].get("iteration") != config.iterations:
        run_evaluation(config.iterations)  # 6. final evaluation and export
    if config.lora is not None and dist.is_main:
        save_lora(transformer, out_dir)
    elif dist.is_main:
        atomic_dir(out_dir, pipe.save_pretrained)
    dist.barrier()  # every rank returns once the export exists
    return result
