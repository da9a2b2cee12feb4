"""The Wan2.1 text-to-video family on a tiny WanPipeline built offline (vgrpo/models/wan.py): prompts encoded and
videos decoded as the pipeline does, Euler sampling over video latents ``(C, F, H, W)`` that reproduces
``WanPipeline.__call__`` (given a flow-matching Euler scheduler: the published UniPC solver is not reproduced), with
and without classifier-free guidance, rollout -> score -> update for V-GRPO and Flow-GRPO on a per-frame reward
averaged per video, and the LoRA export loaded by a plain ``WanPipeline`` sampling what the project samples."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.models.family_training import train_two_iterations
from vgrpo.models.pipeline import build_adapter, load_pipeline
from vgrpo.models.registry import FAMILIES
from vgrpo.models.tiny_wan import TINY_WAN_FRAMES, TINY_WAN_RESOLUTION, TINY_WAN_TOKENS, tiny_wan_pipeline
from vgrpo.models.wan import WanAdapter, WanVelocity, video_frames
from vgrpo.rewards.base import RewardOutput
from vgrpo.rewards.video import PerFrameMean

PROMPTS = ["a cat walking on grass", "waves on a beach"]
LATENT_TOLERANCE = 1e-5
"""Max-abs difference allowed between this project's sampler and ``WanPipeline.__call__``."""
SHAPE = (4, 2, 4, 4)


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("wan") / "pipeline"
    tiny_wan_pipeline(seed=0).save_pretrained(path)
    return path


def _adapter(pipe: Any) -> tuple[WanAdapter, WanVelocity]:
    adapter = WanAdapter(
        pipe, resolution=TINY_WAN_RESOLUTION, num_frames=TINY_WAN_FRAMES, max_sequence_length=TINY_WAN_TOKENS
    )
    return adapter, WanVelocity(pipe.transformer)


def _pipeline_latents(pipe: Any, noise: torch.Tensor, steps: int, **options: Any) -> torch.Tensor:
    return pipe(
        prompt=list(PROMPTS),
        height=TINY_WAN_RESOLUTION,
        width=TINY_WAN_RESOLUTION,
        num_frames=TINY_WAN_FRAMES,
        num_inference_steps=steps,
        latents=noise,
        output_type="latent",
        max_sequence_length=TINY_WAN_TOKENS,
        **({"guidance_scale": 1.0} | options),
    ).frames


def test_the_registry_builds_the_wan_adapter_with_video_latents(wan_dir: Path) -> None:
    pipe = load_pipeline(wan_dir)
    adapter, policy = build_adapter(pipe, resolution=TINY_WAN_RESOLUTION)
    assert isinstance(adapter, WanAdapter) and isinstance(policy, WanVelocity)
    assert adapter.num_frames == 81 and adapter.latent_shape == (4, 21, 4, 4)  # the pipeline's 81 frames
    assert adapter.image_seq_len == 21 * 4 and adapter.scheduler_shift == 3.0
    assert _adapter(pipe)[0].latent_shape == SHAPE
    with pytest.raises(ValueError, match="num_frames 6 is not 4k \\+ 1"):
        WanAdapter(pipe, num_frames=6)
    with pytest.raises(ValueError, match="not a positive multiple of 16"):
        WanAdapter(pipe, resolution=24)


def test_adapter_encodes_prompts_and_decodes_videos_as_the_pipeline_does(wan_dir: Path) -> None:
    pipe = load_pipeline(wan_dir)
    adapter, _ = _adapter(pipe)
    with torch.no_grad():
        ours = adapter.encode_prompts(PROMPTS)
        theirs, _ = pipe.encode_prompt(PROMPTS, do_classifier_free_guidance=False, max_sequence_length=TINY_WAN_TOKENS)
    assert ours.prompt_embeds.shape == (2, TINY_WAN_TOKENS, 16) and ours.pooled_prompt_embeds is None
    torch.testing.assert_close(ours.prompt_embeds, theirs, rtol=0, atol=0)
    assert (ours.prompt_embeds[0, -1] == 0).all()  # zero-padded past the prompt's own tokens
    noise = torch.randn(2, *SHAPE, generator=torch.Generator().manual_seed(3))
    video = pipe(
        prompt=list(PROMPTS),
        height=TINY_WAN_RESOLUTION,
        width=TINY_WAN_RESOLUTION,
        num_frames=TINY_WAN_FRAMES,
        num_inference_steps=2,
        guidance_scale=1.0,
        latents=noise,
        output_type="pt",
        max_sequence_length=TINY_WAN_TOKENS,
    ).frames  # (N, T, 3, H, W) in [0, 1]
    with torch.no_grad():
        decoded = adapter.decode(_pipeline_latents(pipe, noise, 2))
    assert decoded.shape == (2, 3, TINY_WAN_FRAMES, TINY_WAN_RESOLUTION, TINY_WAN_RESOLUTION)
    torch.testing.assert_close((decoded / 2 + 0.5).clamp(0, 1).transpose(1, 2), video, rtol=0, atol=1e-6)
    frames = video_frames(decoded)
    assert frames.shape == (2, TINY_WAN_FRAMES, TINY_WAN_RESOLUTION, TINY_WAN_RESOLUTION, 3)
    assert frames.dtype == np.uint8
    np.testing.assert_array_equal(
        frames[1, 3], ((decoded[1, :, 3].clamp(-1, 1) + 1) * 127.5).round().byte().permute(1, 2, 0).numpy()
    )
    # Encoding a video back: normalised latents of the decoded video's shape.
    with torch.no_grad():
        assert adapter.encode_images(decoded, generator=torch.Generator().manual_seed(0)).shape == (2, *SHAPE)


@pytest.mark.parametrize("steps", [2, 4])
def test_euler_with_wan_velocity_reproduces_wan_pipeline(wan_dir: Path, steps: int) -> None:
    from vgrpo.flow import timestep_grid
    from vgrpo.samplers import euler_ode_sample

    pipe = load_pipeline(wan_dir)
    adapter, policy = _adapter(pipe)
    noise = torch.randn(2, *SHAPE, generator=torch.Generator().manual_seed(0))
    reference = _pipeline_latents(pipe, noise, steps)
    sigmas = timestep_grid(steps, shift=adapter.scheduler_shift, schedule="diffusers")
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas, rtol=0, atol=1e-6)
    with torch.no_grad():
        ours = euler_ode_sample(policy, noise, adapter.encode_prompts(PROMPTS), sigmas)
    assert ours.shape == noise.shape
    assert (ours - reference).abs().max() <= LATENT_TOLERANCE


def test_guided_sampling_reproduces_the_pipelines_cfg_against_the_empty_prompt(wan_dir: Path) -> None:
    from vgrpo.flow import timestep_grid
    from vgrpo.samplers import ClassifierFreeGuidance, euler_ode_sample

    pipe = load_pipeline(wan_dir)
    adapter, policy = _adapter(pipe)
    noise = torch.randn(2, *SHAPE, generator=torch.Generator().manual_seed(4))
    reference = _pipeline_latents(pipe, noise, 3, guidance_scale=5.0)  # negative_prompt defaults to ""
    guided = ClassifierFreeGuidance(policy, adapter.encode_prompts([""]), 5.0)
    with torch.no_grad():
        sigmas = timestep_grid(3, shift=adapter.scheduler_shift, schedule="diffusers")
        ours = euler_ode_sample(guided, noise, adapter.encode_prompts(PROMPTS), sigmas)
        unguided = euler_ode_sample(policy, noise, adapter.encode_prompts(PROMPTS), sigmas)
    assert (ours - reference).abs().max() <= LATENT_TOLERANCE
    assert (unguided - reference).abs().max() > 1e-3


def test_a_unipc_schedulers_flow_shift_is_the_grids_shift(wan_dir: Path) -> None:
    from diffusers import UniPCMultistepScheduler

    pipe = load_pipeline(wan_dir)
    pipe.scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0)
    assert _adapter(pipe)[0].scheduler_shift == 5.0


def _train(pipe: Any, algorithm_name: str) -> tuple[WanAdapter, Any, dict[str, torch.Tensor], list[Any], list[int]]:
    frame_counts: list[int] = []

    def brightness(images: np.ndarray, prompts: Any, metadata: Any) -> RewardOutput:
        frame_counts.append(images.shape[0])
        return RewardOutput(scores=images.reshape(images.shape[0], -1).mean(axis=1) / 255.0)

    per_frame = PerFrameMean(brightness)

    def frames_reward(adapter: Any) -> Any:  # each video's frames scored as images, averaged
        def score(samples: torch.Tensor, prompts: Any) -> dict[str, torch.Tensor]:
            with torch.no_grad():
                videos = video_frames(adapter.decode(samples))
            return {"bright": torch.from_numpy(per_frame(videos, list(prompts)).scores)}

        return score

    trained = train_two_iterations(
        pipe,
        "wan",
        algorithm_name,
        PROMPTS,
        shift=3.0,
        resolution=TINY_WAN_RESOLUTION,
        built=_adapter(pipe),
        reward=frames_reward,
    )
    return (*trained, frame_counts)


@pytest.mark.parametrize("algorithm_name", ["vgrpo", "flow_grpo"])
def test_rollout_score_update_moves_the_wan_lora(wan_dir: Path, algorithm_name: str) -> None:
    _, policy, before, records, frame_counts = _train(load_pipeline(wan_dir), algorithm_name)
    after = policy.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora" in k for k in changed) and any("lora_B" in k for k in changed)
    assert all(math.isfinite(r.metrics["train/loss"]) for r in records)
    assert frame_counts == [6 * TINY_WAN_FRAMES] * 2  # every frame of every video scored, once an iteration


def test_exported_lora_in_a_plain_wan_pipeline_samples_what_the_project_samples(wan_dir: Path, tmp_path: Path) -> None:
    from diffusers import WanPipeline

    from vgrpo.checkpoints.state import LORA_FILE, save_lora
    from vgrpo.flow import timestep_grid
    from vgrpo.samplers import euler_ode_sample

    pipe = load_pipeline(wan_dir)
    adapter, policy, _, _, _ = _train(pipe, "vgrpo")
    save_lora(pipe.transformer, tmp_path / "lora")
    assert (tmp_path / "lora" / LORA_FILE).is_file()

    plain = WanPipeline.from_pretrained(wan_dir, local_files_only=True)
    plain.load_lora_weights(tmp_path / "lora")
    base = WanPipeline.from_pretrained(wan_dir, local_files_only=True)
    noise = torch.randn(2, *SHAPE, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        sigmas = timestep_grid(4, shift=adapter.scheduler_shift, schedule="diffusers")
        ours = euler_ode_sample(policy, noise, adapter.encode_prompts(PROMPTS), sigmas)
    theirs, untrained = _pipeline_latents(plain, noise, 4), _pipeline_latents(base, noise, 4)
    assert (theirs - ours).abs().max() <= LATENT_TOLERANCE  # alpha / rank travelled in the file's metadata
    assert (untrained - ours).abs().max() > 1e-3  # the trained adapter changes the samples


def test_the_wan_recipe_loads_as_a_stage_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from vgrpo.config import StageConfig, load_config

    monkeypatch.setenv("VGRPO_MODELS", "/models")
    root = Path(__file__).parents[2] / "params"
    files = [root / "base.yaml", root / "models/wan.yaml", root / "stages/wan/clip-pickscore.yaml"]
    config = load_config(files, schema=StageConfig)
    assert [(r.name, r.weight) for r in config.rewards] == [("clipscore", 1.0), ("pickscore", 0.5)]  # per frame
    assert config.advantage.aggregation == "normalize_then_sum" and config.ema.enabled and config.ema.every == 4
    assert str(config.pipeline) == "/models/Wan2.1-T2V-14B-Diffusers"
    rollout, lora = config.rollout, config.lora
    assert (rollout.resolution, rollout.num_steps, rollout.shift, rollout.dynamic_shift) == (256, 10, 3.0, False)
    assert (rollout.prompts_per_iteration, rollout.group_size, config.optim.lr) == (48, 16, 1e-4)
    assert rollout.num_frames == 5 and config.optim.max_grad_norm == 1.0
    assert lora is not None and (lora.rank, lora.alpha) == (64, 128)
    targets = lora.targets(FAMILIES["wan"].lora_targets)  # the recipe leaves them at the default: the family's
    assert set(targets) == set(FAMILIES["wan"].lora_targets)
    assert (config.evaluation.num_steps, config.evaluation.guidance_scale, config.evaluation.num_frames) == (
        28,
        5.0,
        13,
    )
    names = [n for n, _ in tiny_wan_pipeline(seed=0).transformer.named_modules()]
    assert all(any(n.endswith(t) for n in names) for t in targets)


def test_fsdp_finds_the_wan_transformers_blocks() -> None:
    from collections import Counter

    from vgrpo.parallel.fsdp import _blocks

    transformer = tiny_wan_pipeline(seed=0).transformer
    assert Counter(type(b).__name__ for b in _blocks(transformer)) == {"WanTransformerBlock": 1}
