"""Pretraining of the embedded default pipeline on freshly rendered world pairs.

Three parts, in order, as for a real latent text-to-image model:

1. a CLIP-style BPE tokenizer trained on the train prompts (:func:`vgrpo.models.embedded.train_clip_tokenizer`);
2. the VAE, trained to reconstruct renders (L1 + L2 + a small KL), after which ``scaling_factor`` and
   ``shift_factor`` are set from the latent statistics so that latents are roughly N(0, 1), as SD3's were;
3. the SD3 transformer, by rectified-flow matching with SD3's logit-normal timestep density
   (Esser et al. 2024, §3.1): ``t = sigmoid(u), u ~ N(m, s)``, ``x_t = (1 - t) x0 + t eps``, loss
   ``||v_hat - (eps - x0)||^2``. With no pretrained text encoders to freeze (SD3 freezes its CLIPs and T5), the
   two CLIP encoders are trained jointly by default (``train_text_encoders``); the saved transformer and
   encoders are an EMA of the trained weights.

Checkpoints go to ``<work_dir>/checkpoints/step-<n>/`` (written to a temporary folder, then renamed) and a run
resumes from the newest complete one; the final pipeline is written atomically to ``pipeline_dir``. The
checkpoint of every evaluated step is kept: ``release_step`` releases one of them as the base (a run of the same
params stops there, or resumes from it when it was written already), so the base can be the step of the schedule
whose model leaves RL room rather than the last.
"""

from __future__ import annotations

import copy
import json
import resource
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from vgrpo.atomic import atomic_dir
from vgrpo.evaluation.evaluator import Sampling
from vgrpo.evaluation.evaluator import evaluate as evaluate_pipeline
from vgrpo.flow import interpolate, timestep_grid, velocity_target
from vgrpo.images import images_to_tensor, tensor_to_images
from vgrpo.models.embedded import build_pipeline, train_clip_tokenizer
from vgrpo.models.pipeline import load_sd3_pipeline
from vgrpo.models.saving import write_pipeline
from vgrpo.models.sd3 import SD3Adapter, SD3Velocity
from vgrpo.policy import Conditioning
from vgrpo.progress import progress_bar
from vgrpo.prompts import load_prompts
from vgrpo.rewards.multi import MultiReward
from vgrpo.samplers import euler_ode_sample
from vgrpo.training.optim import build_adamw, clip_gradients
from vgrpo.world.config import PretrainConfig
from vgrpo.world.data import world_batch
from vgrpo.world.prompts import allowed_pairs, sample_metadata
from vgrpo.world.scene import TEXT_BAND
from vgrpo.world.schedule import one_cycle

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


def logit_normal_timesteps(n: int, mean: float, std: float, generator: torch.Generator) -> Tensor:
    """SD3's training density over ``t`` in (0, 1): ``sigmoid(N(mean, std))``, shape ``(n,)``."""
    return torch.sigmoid(mean + std * torch.randn(n, generator=generator))


def flow_matching_loss(velocity: nn.Module, x0: Tensor, cond: Any, t: Tensor, eps: Tensor) -> Tensor:
    """Rectified-flow matching loss (SD3, Esser et al. 2024; V-GRPO Sec. 3):
    ``mean ||v_theta(x_t, t) - (eps - x0)||^2``."""
    v_hat = velocity(interpolate(x0, eps, t), t, cond)
    return (v_hat.float() - velocity_target(x0, eps)).pow(2).mean()


def vae_loss(
    vae: Any, x: Tensor, kl_weight: float, generator: torch.Generator, pixel_weight: Tensor | None = None
) -> Tensor:
    """L1 + L2 reconstruction of a posterior sample (each pixel weighted by ``pixel_weight``, ``(H, W)``, mean 1
    over the image when given) plus ``kl_weight`` x KL to N(0, I)."""
    dist = vae.encode(x).latent_dist
    recon = vae.decode(dist.sample(generator=generator)).sample
    error = (recon - x).abs() + (recon - x).pow(2)
    if pixel_weight is not None:
        error = error * pixel_weight
    return error.mean() + kl_weight * dist.kl().mean() / x[0].numel()


def text_band_weights(resolution: int, weight: float) -> Tensor:
    """Per-pixel loss weights ``(H, W)``: ``weight`` on the text band's rows (:data:`vgrpo.world.scene.TEXT_BAND`),
    1 elsewhere, scaled to mean 1."""
    rows = torch.ones(resolution)
    rows[resolution - round(TEXT_BAND * resolution) :] = weight
    grid = rows[:, None].expand(resolution, resolution)
    return grid / grid.mean()


def train_vae(vae: Any, config: PretrainConfig, rng: np.random.Generator, generator: torch.Generator) -> float:
    """Train ``vae`` in place on fresh renders; returns the final loss."""
    cfg, allowed = config.vae, allowed_pairs(config.held_out_pairs)
    opt = build_adamw(vae.parameters(), cfg)
    warmup = max(1, cfg.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: one_cycle(s, cfg.steps, warmup))
    vae.train()
    loss = torch.tensor(float("nan"))
    with progress_bar(cfg.steps, "vae") as bar:
        for _ in range(cfg.steps):
            _, images = world_batch(rng, cfg.batch_size, config.tags, allowed, config.model.resolution)
            loss = vae_loss(vae, images_to_tensor(images), cfg.kl_weight, generator)
            loss.backward()
            clip_gradients(vae.parameters(), cfg)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
            bar.update()
    vae.eval()
    return float(loss.item())


def finetune_decoder(vae: Any, config: PretrainConfig, rng: np.random.Generator, generator: torch.Generator) -> float:
    """Train ``vae``'s decoder alone (the encoder, and so the latents, frozen) for ``config.vae.decoder_steps`` on
    fresh renders, the text band's pixels weighted ``text_band_weight``: the glyphs and object edges the rewards
    read are what a decoder trained on the whole image blurs first. Returns the final loss."""
    cfg, allowed = config.vae, allowed_pairs(config.held_out_pairs)
    # The decoder and the 1x1 convolution before it (None when the VAE is built without quant convs).
    decoder = [p for m in (vae.decoder, vae.post_quant_conv) if m is not None for p in m.parameters()]
    vae.requires_grad_(False)
    for p in decoder:
        p.requires_grad_(True)
    opt = build_adamw([{"params": decoder, "lr": cfg.decoder_lr}], cfg)
    warmup = max(1, cfg.decoder_steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: one_cycle(s, cfg.decoder_steps, warmup))
    weights = text_band_weights(config.model.resolution, cfg.text_band_weight)
    vae.decoder.train()
    loss = torch.tensor(float("nan"))
    with progress_bar(cfg.decoder_steps, "vae decoder") as bar:
        for _ in range(cfg.decoder_steps):
            _, images = world_batch(rng, cfg.batch_size, config.tags, allowed, config.model.resolution)
            loss = vae_loss(vae, images_to_tensor(images), 0.0, generator, weights)
            loss.backward()
            clip_gradients(decoder, cfg)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
            bar.update()
    vae.requires_grad_(True).eval()
    return float(loss.item())


@torch.no_grad()
def set_latent_normalisation(vae: Any, images: Tensor) -> tuple[float, float]:
    """Set the VAE's ``shift_factor`` (latent mean) and ``scaling_factor`` (1 / latent std) from ``images``."""
    z = vae.encode(images).latent_dist.mode()
    shift, scale = float(z.mean()), float(1.0 / z.std())
    vae.register_to_config(shift_factor=shift, scaling_factor=scale)
    return shift, scale


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


@dataclass
class PretrainState:
    """What a checkpoint holds besides the pipeline: the step, optimiser, EMA and RNG states."""

    step: int = 0
    history: list[dict[str, float]] = field(default_factory=list)


def _latest_checkpoint(ckpt_root: Path, at_most: int) -> Path | None:
    done = [p for p in ckpt_root.glob("step-*") if (p / "state.pt").is_file() and int(p.name.split("-")[1]) <= at_most]
    return max(done, key=lambda p: int(p.name.split("-")[1])) if done else None


def _identity(config: PretrainConfig) -> dict[str, Any]:
    """What a checkpoint must share with the run to be resumed: every param but ``release_step``, which only says
    where the run stops."""
    return config.model_dump(mode="json", exclude={"release_step"})


def pretrain(
    config: PretrainConfig,
    work_dir: str | Path,
    pipeline_dir: str | Path | None = None,
    *,
    evaluate: Callable[[SD3Adapter, nn.Module, int], dict[str, float]] | None = None,
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
    allowed = allowed_pairs(config.held_out_pairs)

    stop = config.release_step or config.steps
    latest = _latest_checkpoint(ckpt_root, stop)
    saved = torch.load(latest / "state.pt", weights_only=True) if latest is not None else None
    if saved is not None and saved.get("config") != _identity(config):
        # A checkpoint of other params (DVC re-runs the stage after a params change) is not this run.
        log(f"{latest} was written with other params: starting afresh")
        for old in ckpt_root.glob("step-*"):
            shutil.rmtree(old)
        latest, saved = None, None
    if latest is not None:
        log(f"resuming from {latest}")
        pipe = load_sd3_pipeline(latest / "pipeline")
    else:
        log("training the tokenizer and the VAE")
        if tokenizer is None:
            tokenizer = train_clip_tokenizer(_prompt_corpus(config), config.model)
        pipe = build_pipeline(config.model, tokenizer, seed=config.seed)
        pipe.set_progress_bar_config(disable=True)
        t0 = time.perf_counter()
        vae_final = train_vae(pipe.vae, config, rng, generator)
        if config.vae.decoder_steps:
            vae_final = finetune_decoder(pipe.vae, config, rng, generator)
        _, images = world_batch(rng, 512, config.tags, allowed, config.model.resolution)
        shift, scale = set_latent_normalisation(pipe.vae, images_to_tensor(images))
        log(
            f"vae: loss {vae_final:.4f} in {time.perf_counter() - t0:.0f} s; latent shift {shift:.3f} scale {scale:.3f}"
        )
    pipe.vae.requires_grad_(False).eval()
    # The trained modules and their EMA, in pipeline slots: the transformer, and the two CLIP encoders when
    # they are trained too (random frozen encoders give the transformer a code it must first learn to read).
    slots = ("transformer", "text_encoder", "text_encoder_2") if config.train_text_encoders else ("transformer",)
    if not config.train_text_encoders:
        pipe.text_encoder.requires_grad_(False).eval()
        pipe.text_encoder_2.requires_grad_(False).eval()
    trained = nn.ModuleList([getattr(pipe, name) for name in slots]).train()
    ema = copy.deepcopy(trained).eval().requires_grad_(False)  # on resume: the saved pipeline holds the EMA
    opt = build_adamw(trained.parameters(), config)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: one_cycle(s, config.steps, config.warmup_steps))
    state = PretrainState()
    if saved is not None:
        trained.load_state_dict(saved["trained"])
        opt.load_state_dict(saved["optimizer"])
        sched.load_state_dict(saved["scheduler"])
        rng.bit_generator.state = saved["numpy_rng"]
        generator.set_state(saved["torch_rng"])
        state = PretrainState(step=saved["step"], history=saved["history"])
    velocity = SD3Velocity(trained[0])
    images_adapter = SD3Adapter(pipe, max_sequence_length=0)  # VAE encoding (and cached prompts if frozen)

    def use(modules: nn.ModuleList) -> None:
        for name, module in zip(slots, modules, strict=True):
            setattr(pipe, name, module)

    def condition(prompts: list[str]) -> Any:
        if not config.train_text_encoders:
            return images_adapter.encode_prompts(prompts)
        embeds, _, pooled, _ = pipe.encode_prompt(
            prompt=prompts, prompt_2=None, prompt_3=None, do_classifier_free_guidance=False, max_sequence_length=0
        )
        return Conditioning(prompt_embeds=embeds, pooled_prompt_embeds=pooled)

    def save_checkpoint() -> None:
        def write(tmp: Path) -> None:
            use(ema)
            write_pipeline(pipe, tmp / "pipeline")
            use(trained)
            state_dict = {
                "trained": trained.state_dict(),
                "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(),
                "numpy_rng": rng.bit_generator.state,
                "torch_rng": generator.get_state(),
                "step": state.step,
                "history": state.history,
                "config": _identity(config),
            }
            torch.save(state_dict, tmp / "state.pt")

        atomic_dir(ckpt_root / f"step-{state.step}", write)
        for old in ckpt_root.glob("step-*"):  # the newest, and each evaluated one: the candidate releases
            step = int(old.name.split("-")[1])
            if step != state.step and step % config.eval_every:
                shutil.rmtree(old, ignore_errors=True)

    def run_evaluation() -> dict[str, float]:
        assert evaluate is not None
        use(ema)
        try:  # a fresh adapter: its prompt cache must come from the EMA encoders
            return evaluate(SD3Adapter(pipe, max_sequence_length=0), SD3Velocity(ema[0]), state.step)
        finally:
            use(trained)

    t_start, losses = time.perf_counter(), []
    with progress_bar(stop, "transformer", initial=state.step) as bar:
        while state.step < stop:
            prompts, images = world_batch(rng, config.batch_size, config.tags, allowed, config.model.resolution)
            with torch.no_grad():
                x0 = images_adapter.encode_images(images_to_tensor(images), generator=generator)
            t = logit_normal_timesteps(len(prompts), config.logit_normal_mean, config.logit_normal_std, generator)
            eps = torch.randn(x0.shape, generator=generator)
            loss = flow_matching_loss(velocity, x0, condition(prompts), t, eps)
            loss.backward()
            grad_norm = float(clip_gradients(trained.parameters(), config))
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            # EMA warm-up (1 + n) / (10 + n): early weights are forgotten quickly in a run this short.
            _ema_update(ema, trained, min(config.ema_decay, (1 + state.step) / (10 + state.step)))
            state.step += 1
            losses.append(float(loss.item()))
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}", gnorm=f"{grad_norm:.2f}", refresh=False)
            bar.update()
            last = state.step == stop
            if evaluate is not None and (state.step % config.eval_every == 0 or last):
                metrics = {"step": float(state.step), "loss": float(np.mean(losses[-config.eval_every :]))}
                metrics |= run_evaluation()
                metrics["elapsed_s"] = time.perf_counter() - t_start
                state.history.append(metrics)
                log(" ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
            if state.step % config.checkpoint_every == 0 or last:
                save_checkpoint()

    final = Path(pipeline_dir) if pipeline_dir is not None else Path(work_dir) / "pipeline"
    use(ema)

    def write_final(tmp: Path) -> None:
        write_pipeline(pipe, tmp)
        (tmp / "pretrain_history.json").write_text(json.dumps(state.history, indent=1))

    atomic_dir(final, write_final)
    return final


@torch.no_grad()
def _ema_update(ema: nn.Module, model: nn.Module, decay: float) -> None:
    for e, p in zip(ema.parameters(), model.parameters(), strict=True):
        e.lerp_(p.detach(), 1.0 - decay)


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
    rewards = MultiReward.from_specs([{"name": "geneval"}, {"name": "ocr", "options": text_line}])

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
