"""Pretraining of the embedded default pipeline on freshly rendered world pairs.

Three parts, in order, as for a real latent text-to-image model:

1. a CLIP-style BPE tokenizer trained on the train prompts (:func:`vgrpo.models.embedded.train_clip_tokenizer`);
2. the VAE (:mod:`vgrpo.world.vae_training`), trained to reconstruct renders (L1 + L2 + a small KL), after which
   ``scaling_factor`` and ``shift_factor`` are set from the latent statistics so that latents are roughly N(0, 1),
   as SD3's were;
3. the SD3 transformer (:mod:`vgrpo.world.transformer_training`), by rectified-flow matching with SD3's
   logit-normal timestep density (Esser et al. 2024, §3.1): ``t = sigmoid(u), u ~ N(m, s)``,
   ``x_t = (1 - t) x0 + t eps``, loss ``||v_hat - (eps - x0)||^2``. With no pretrained text encoders to freeze
   (SD3 freezes its CLIPs and T5), the two CLIP encoders are trained jointly by default (``train_text_encoders``);
   the saved transformer and encoders are an EMA of the trained weights.

Checkpoints go to ``<work_dir>/checkpoints/step-<n>/`` (written to a temporary folder, then renamed) and a run
resumes from the newest complete one; the final pipeline is written atomically to ``pipeline_dir``. The
checkpoint of every evaluated step is kept: ``release_step`` releases one of them as the base (a run of the same
params stops there, or resumes from it when it was written already), so the base can be the step of the schedule
whose model leaves RL room rather than the last.
"""

from __future__ import annotations

import json
import resource
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vgrpo.atomic import atomic_dir
from vgrpo.evaluation.evaluator import Sampling
from vgrpo.evaluation.evaluator import evaluate as evaluate_pipeline
from vgrpo.flow import timestep_grid
from vgrpo.images import images_to_tensor, tensor_to_images
from vgrpo.models.embedded import build_pipeline, train_clip_tokenizer
from vgrpo.models.pipeline import load_sd3_pipeline
from vgrpo.models.sd3 import SD3Adapter
from vgrpo.progress_bar import progress_bar
from vgrpo.prompts import load_prompts
from vgrpo.rewards.config import RewardConfig
from vgrpo.rewards.multi import MultiReward
from vgrpo.samplers import euler_ode_sample
from vgrpo.world.config import PretrainConfig
from vgrpo.world.data import world_batch
from vgrpo.world.prompts import allowed_pairs, sample_metadata
from vgrpo.world.scene import TEXT_BAND
from vgrpo.world.transformer_training import (
    Evaluate,
    PretrainState,
    TransformerTraining,
    checkpoint_identity,
    flow_matching_loss,
    logit_normal_timesteps,
)
from vgrpo.world.vae_training import finetune_decoder, set_latent_normalisation, train_vae
from vgrpo.world.vae_training import text_band_weights as text_band_weights  # importable from here as before
from vgrpo.world.vae_training import vae_loss as vae_loss

__all__ = [
    "PretrainState",
    "finetune_decoder",
    "flow_matching_loss",
    "logit_normal_timesteps",
    "pretrain",
    "pretrain_base",
    "sample_images",
    "train_vae",
]

Log = Callable[[str], None]


@torch.no_grad()
def sample_images(
    adapter: SD3Adapter,
    velocity: nn.Module,
    prompts: list[str],
    num_steps: int,
    generator: torch.Generator,
    *,
    shift: float | None = None,
    micro_batch: int = 64,
) -> np.ndarray:
    """Euler ODE samples for ``prompts`` decoded to uint8 ``(N, H, W, 3)``, with the same sampler as RL rollouts."""
    sigmas = timestep_grid(num_steps, shift=shift)
    out = []
    for i in range(0, len(prompts), micro_batch):
        chunk = prompts[i : i + micro_batch]
        cond = adapter.encode_prompts(chunk)
        noise = torch.randn(len(chunk), *adapter.latent_shape, generator=generator)
        latents = euler_ode_sample(velocity, noise, cond, sigmas)
        out.append(tensor_to_images(adapter.decode(latents)))
    return np.concatenate(out)


def _step_of(checkpoint: Path) -> int:
    return int(checkpoint.name.split("-")[1])


def _latest_checkpoint(ckpt_root: Path, at_most: int) -> Path | None:
    done = [p for p in ckpt_root.glob("step-*") if (p / "state.pt").is_file() and _step_of(p) <= at_most]
    return max(done, key=_step_of) if done else None


def _resumable(config: PretrainConfig, ckpt_root: Path, stop: int, log: Log) -> tuple[Path | None, Any]:
    """The newest checkpoint of this run at step ``stop`` or before, with its saved state; ``(None, None)`` when
    there is none. Checkpoints written with other params are deleted."""
    latest = _latest_checkpoint(ckpt_root, stop)
    if latest is None:
        return None, None
    saved = torch.load(latest / "state.pt", weights_only=True)
    if saved.get("config") != checkpoint_identity(config):
        # A checkpoint of other params (DVC re-runs the stage after a params change) is not this run.
        log(f"{latest} was written with other params: starting afresh")
        for old in ckpt_root.glob("step-*"):
            shutil.rmtree(old)
        return None, None
    return latest, saved


def _save_checkpoint(run: TransformerTraining, ckpt_root: Path) -> None:
    """Write ``step-<n>`` of the run's current step; of the older checkpoints, keep the evaluated steps' only."""
    atomic_dir(ckpt_root / f"step-{run.state.step}", run.write_checkpoint)
    for old in ckpt_root.glob("step-*"):  # the newest, and each evaluated one: the candidate releases
        step = _step_of(old)
        if step != run.state.step and step % run.config.eval_every:
            shutil.rmtree(old, ignore_errors=True)


def _new_pipeline(
    config: PretrainConfig, tokenizer: Any, rng: np.random.Generator, generator: torch.Generator, log: Log
) -> Any:
    """The pipeline of ``config`` after pretraining's first two parts: its tokenizer (trained on the prompt corpus
    unless given) and its VAE, trained and with its latents normalised."""
    log("training the tokenizer and the VAE")
    if tokenizer is None:
        tokenizer = train_clip_tokenizer(_prompt_corpus(config), config.model)
    pipe = build_pipeline(config.model, tokenizer, seed=config.seed)
    pipe.set_progress_bar_config(disable=True)
    t0 = time.perf_counter()
    vae_final = train_vae(pipe.vae, config, rng, generator)
    if config.vae.decoder_steps:
        vae_final = finetune_decoder(pipe.vae, config, rng, generator)
    allowed = allowed_pairs(config.held_out_pairs)
    _, images = world_batch(rng, 512, config.tags, allowed, config.model.resolution)
    shift, scale = set_latent_normalisation(pipe.vae, images_to_tensor(images))
    log(f"vae: loss {vae_final:.4f} in {time.perf_counter() - t0:.0f} s; latent shift {shift:.3f} scale {scale:.3f}")
    return pipe


def _train_transformer(
    run: TransformerTraining, stop: int, ckpt_root: Path, evaluate: Evaluate | None, log: Log
) -> None:
    """Train to step ``stop``, evaluating (when ``evaluate`` is given) every ``eval_every`` steps and checkpointing
    every ``checkpoint_every`` steps, both at ``stop`` too."""
    config, state = run.config, run.state
    t_start, losses = time.perf_counter(), []
    with progress_bar(stop, "transformer", initial=state.step) as bar:
        while state.step < stop:
            loss, grad_norm = run.step()
            losses.append(loss)
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}", gnorm=f"{grad_norm:.2f}", refresh=False)
            bar.update()
            last = state.step == stop
            if evaluate is not None and (state.step % config.eval_every == 0 or last):
                metrics = {"step": float(state.step), "loss": float(np.mean(losses[-config.eval_every :]))}
                metrics |= run.evaluate(evaluate)
                metrics["elapsed_s"] = time.perf_counter() - t_start
                state.history.append(metrics)
                log(" ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
            if state.step % config.checkpoint_every == 0 or last:
                _save_checkpoint(run, ckpt_root)


def pretrain(
    config: PretrainConfig,
    work_dir: str | Path,
    pipeline_dir: str | Path | None = None,
    *,
    evaluate: Evaluate | None = None,
    log: Log = print,
    tokenizer: Any = None,
) -> Path:
    """Pretrain the embedded pipeline described by ``config``; returns the pipeline directory.

    Args:
        config: architecture, data and schedule.
        work_dir: run folder for checkpoints; a run with a checkpoint there resumes from it.
        pipeline_dir: where the final pipeline goes (default ``<work_dir>/pipeline``).
        evaluate: called every ``config.eval_every`` steps and at the end with the adapter, the EMA velocity
            model and the step; returns metrics to record.
        log: line logger.
        tokenizer: a CLIP tokenizer to use instead of training one on the prompt corpus.
    """
    torch.set_flush_denormal(True)  # stack-notes: denormals slow CPU training ~5x after a few hundred steps
    ckpt_root = Path(work_dir) / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    stop = config.release_step or config.steps
    latest, saved = _resumable(config, ckpt_root, stop, log)
    if latest is not None:
        log(f"resuming from {latest}")
        pipe = load_sd3_pipeline(latest / "pipeline")
    else:
        pipe = _new_pipeline(config, tokenizer, rng, generator, log)
    run = TransformerTraining(config, pipe, rng, generator, saved)
    _train_transformer(run, stop, ckpt_root, evaluate, log)
    final = Path(pipeline_dir) if pipeline_dir is not None else Path(work_dir) / "pipeline"
    atomic_dir(final, run.write_final)
    return final


def _prompt_corpus(config: PretrainConfig, n: int = 4000) -> list[str]:
    rng = np.random.default_rng(config.seed + 1)
    allowed = allowed_pairs(config.held_out_pairs)
    return [sample_metadata(rng, config.tags[i % len(config.tags)], allowed)["prompt"] for i in range(n)]


def pretrain_base(
    config: PretrainConfig, test_split: str | Path, work_dir: str | Path, pipeline_dir: str | Path
) -> tuple[Path, dict[str, Any]]:
    """:func:`pretrain` evaluated every ``config.eval_every`` steps: GenEval (strict, partial, varied groups) and
    OCR of the EMA model on the first ``config.eval_prompts`` prompts of ``test_split``. Returns the pipeline
    directory and the run's metrics: wall time, peak memory and the last evaluation."""
    metadata = load_prompts(test_split)[: config.eval_prompts]
    # The world's OCR reward reads the text band's line alone, as the world's evaluation does (README).
    text_line = {"line_box": [0.0, 1.0 - TEXT_BAND, 1.0, 1.0]}
    rewards = MultiReward.from_configs([RewardConfig(name="geneval"), RewardConfig(name="ocr", options=text_line)])

    def evaluate(adapter: SD3Adapter, velocity: nn.Module, step: int) -> dict[str, float]:
        table, _ = evaluate_pipeline(
            adapter=adapter,
            policy=velocity,
            metadata=metadata,
            rewards=rewards,
            group_size=config.eval_group,
            sampling=Sampling(config.sample_steps, config.seed, config.model.scheduler_shift),
        )
        geneval, ocr = table["rewards"]["geneval"], table["rewards"]["ocr"]
        out = {k: geneval.get(k) for k in ("geneval_strict", "geneval_partial", "varied_group_frac")}
        out["ocr"] = ocr["mean"]
        return {k: float(v) for k, v in out.items() if v is not None}

    t0 = time.perf_counter()
    final = pretrain(config, work_dir, pipeline_dir, evaluate=evaluate)
    history = json.loads((final / "pretrain_history.json").read_text())
    return final, {
        "wall_s": time.perf_counter() - t0,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "final": history[-1] if history else {},
    }
