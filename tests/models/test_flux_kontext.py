"""The FLUX.1-Kontext family on a tiny FluxKontextPipeline built offline (vgrpo/models/flux_kontext.py): condition
images encoded as the pipeline encodes them (cached), the condition tokens fed to every forward of the velocity
model, sampling that reproduces ``FluxKontextPipeline(image=..., prompt=...)``, rollout -> score -> update for V-GRPO
and Flow-GRPO with the condition present in every phase, and the LoRA export loaded by a plain
``FluxKontextPipeline`` sampling the same latents as the project's sampler."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.models.family_training import train_two_iterations
from vgrpo.models.flux import pack_latents, unpack_latents
from vgrpo.models.flux_kontext import (
    KONTEXT_GUIDANCE,
    FluxKontextAdapter,
    FluxKontextVelocity,
    condition_image_ids,
    load_condition_image,
)
from vgrpo.models.pipeline import build_adapter, load_pipeline
from vgrpo.models.registry import FAMILIES
from vgrpo.models.tiny_flux_kontext import tiny_flux_kontext_pipeline, write_condition_image

PROMPTS = ["a photo of a red circle", "two blue squares"]
LATENT_TOLERANCE = 1e-5
"""Max-abs difference allowed between this project's sampler and ``FluxKontextPipeline.__call__``."""


@pytest.fixture(scope="module")
def kontext_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kontext")
    tiny_flux_kontext_pipeline(seed=0).save_pretrained(root / "pipeline")
    for i in range(2):
        write_condition_image(root / f"source{i}.png", seed=i)
    write_condition_image(root / "large.png", seed=7, size=24)
    return root


def _rows(root: Path) -> list[dict[str, Any]]:
    return [{"prompt": p, "image": str(root / f"source{i}.png")} for i, p in enumerate(PROMPTS)]


def _pipeline_latents(pipe: Any, root: Path, noise: torch.Tensor, steps: int) -> torch.Tensor:
    """``FluxKontextPipeline.__call__``'s final latents editing the two source images from ``noise``, unpacked."""
    packed = pipe(
        image=[load_condition_image(root / f"source{i}.png") for i in range(2)],
        prompt=list(PROMPTS),
        height=16,
        width=16,
        max_area=16 * 16,
        _auto_resize=False,
        num_inference_steps=steps,
        guidance_scale=KONTEXT_GUIDANCE,
        latents=pack_latents(noise),
        output_type="latent",
        max_sequence_length=16,
    ).images
    return unpack_latents(packed, 8, 8)


def test_adapter_encodes_condition_images_as_the_pipeline_does(kontext_dir: Path) -> None:
    from diffusers.pipelines.flux.pipeline_flux_kontext import FluxKontextPipeline

    pipe = load_pipeline(kontext_dir / "pipeline")
    adapter, policy = build_adapter(pipe, resolution=16)
    assert isinstance(adapter, FluxKontextAdapter) and isinstance(policy, FluxKontextVelocity)
    assert policy.guidance_scale == KONTEXT_GUIDANCE == 2.5
    assert adapter.latent_shape == (4, 8, 8) and adapter.image_seq_len == 16  # the shift counts the noisy tokens
    # Condition ids: the noisy tokens' with the first axis 1.
    ids = FluxKontextPipeline._prepare_latent_image_ids(1, 4, 4, "cpu", torch.float32)
    ids[..., 0] = 1
    assert torch.equal(condition_image_ids(8, 8, dtype=torch.float32), ids)
    # Resized to the adapter's side (a 24 px source too), mapped to [-1, 1], the posterior's mode, normalised.
    paths = [kontext_dir / "source0.png", kontext_dir / "large.png"]
    with torch.no_grad():
        ours = adapter.encode_condition_images(paths)
        pixels = torch.cat(
            [
                pipe.image_processor.preprocess(pipe.image_processor.resize(load_condition_image(p), 16, 16), 16, 16)
                for p in paths
            ]
        )
        reference = pipe._encode_vae_image(pixels, generator=None)
    assert ours.shape == (2, 4, 8, 8)
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-6)
    # Cached per (path, resolution): the second encoding reads the cache; another side encodes anew.
    hits = adapter.image_cache.hits
    adapter.encode_condition_images(paths)
    assert adapter.image_cache.hits == hits + 2 and len(adapter.image_cache) == 2
    assert adapter.resized(8).encode_condition_images(paths[:1]).shape == (1, 4, 4, 4)
    assert len(adapter.image_cache) == 3  # the resized copy shares the cache
    # Rows: every row names a condition image, or none does.
    cond = adapter.encode_rows(_rows(kontext_dir))
    assert cond.image_latents is not None and cond.image_latents.shape == (2, 4, 8, 8)
    assert adapter.encode_rows([{"prompt": p} for p in PROMPTS]).image_latents is None
    with pytest.raises(ValueError, match="1 of 2 prompt rows name a condition image"):
        adapter.encode_rows([_rows(kontext_dir)[0], {"prompt": PROMPTS[1]}])


@pytest.mark.parametrize("steps", [2, 4])
def test_euler_with_kontext_velocity_reproduces_flux_kontext_pipeline(kontext_dir: Path, steps: int) -> None:
    from vgrpo.flow import timestep_grid
    from vgrpo.samplers import euler_ode_sample

    pipe = load_pipeline(kontext_dir / "pipeline")
    adapter, policy = build_adapter(pipe, resolution=16)
    noise = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    reference = _pipeline_latents(pipe, kontext_dir, noise, steps)
    sigmas = timestep_grid(steps, shift=adapter.scheduler_shift)
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas, rtol=0, atol=1e-6)  # FLUX.1's shift, noisy tokens
    cond = adapter.encode_rows(_rows(kontext_dir))
    with torch.no_grad():
        ours = euler_ode_sample(policy, noise, cond, sigmas)
        text_only = euler_ode_sample(policy, noise, replace(cond, image_latents=None), sigmas)
    assert (ours - reference).abs().max() <= LATENT_TOLERANCE
    assert (text_only - reference).abs().max() > 1e-2  # the condition image is fed


def test_the_condition_image_changes_the_velocity(kontext_dir: Path) -> None:
    pipe = load_pipeline(kontext_dir / "pipeline")
    adapter, policy = build_adapter(pipe, resolution=16)
    cond = adapter.encode_rows(_rows(kontext_dir))
    assert cond.image_latents is not None
    x, t = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(1)), torch.tensor([0.7, 0.4])
    swapped = replace(cond, image_latents=cond.image_latents.flip(0))
    with torch.no_grad():
        v, v_swapped, v_text = (policy(x, t, c) for c in (cond, swapped, replace(cond, image_latents=None)))
    assert v.shape == x.shape
    assert (v - v_swapped).abs().amin(dim=(1, 2, 3)).min() > 0 and (v - v_swapped).abs().max() > 1e-3
    assert (v - v_text).abs().max() > 1e-3


def _train(
    pipe: Any, root: Path, algorithm_name: str
) -> tuple[Any, Any, dict[str, torch.Tensor], list[Any], list[bool]]:
    adapter, policy = build_adapter(pipe, resolution=16)
    seen: list[bool] = []  # whether each forward of the policy (rollout, prepare, update) saw the condition image

    def spy(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        cond = args[2] if len(args) > 2 else kwargs["cond"]
        seen.append(cond.image_latents is not None and cond.image_latents.shape[0] == args[0].shape[0])

    handle = policy.register_forward_pre_hook(spy, with_kwargs=True)
    trained = train_two_iterations(
        pipe,
        "flux-kontext",
        algorithm_name,
        PROMPTS,
        shift=3.0,
        built=(adapter, policy),
        encode=lambda a: a.encode_rows(_rows(root)),
    )
    handle.remove()
    return (*trained, seen)


@pytest.mark.parametrize("algorithm_name", ["vgrpo", "flow_grpo"])
def test_rollout_score_update_moves_the_kontext_lora_with_the_condition_in_every_forward(
    kontext_dir: Path, algorithm_name: str
) -> None:
    _, policy, before, records, seen = _train(load_pipeline(kontext_dir / "pipeline"), kontext_dir, algorithm_name)
    after = policy.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora" in k for k in changed) and any("lora_B" in k for k in changed)
    assert all(math.isfinite(r.metrics["train/loss"]) for r in records)
    assert len(seen) > 6 and all(seen)  # every rollout, surrogate and update forward carried the condition


def test_exported_lora_in_a_plain_kontext_pipeline_samples_what_the_project_samples(
    kontext_dir: Path, tmp_path: Path
) -> None:
    from diffusers import FluxKontextPipeline

    from vgrpo.checkpoints.state import LORA_FILE, save_lora
    from vgrpo.flow import timestep_grid
    from vgrpo.samplers import euler_ode_sample

    pipe = load_pipeline(kontext_dir / "pipeline")
    adapter, policy, _, _, _ = _train(pipe, kontext_dir, "vgrpo")
    save_lora(pipe.transformer, tmp_path / "lora")
    assert (tmp_path / "lora" / LORA_FILE).is_file()

    plain = FluxKontextPipeline.from_pretrained(kontext_dir / "pipeline", local_files_only=True)
    plain.load_lora_weights(tmp_path / "lora")
    base = FluxKontextPipeline.from_pretrained(kontext_dir / "pipeline", local_files_only=True)
    noise = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        sigmas = timestep_grid(4, shift=adapter.scheduler_shift)
        ours = euler_ode_sample(policy, noise, adapter.encode_rows(_rows(kontext_dir)), sigmas)
    theirs = _pipeline_latents(plain, kontext_dir, noise, 4)
    untrained = _pipeline_latents(base, kontext_dir, noise, 4)
    assert (theirs - ours).abs().max() <= LATENT_TOLERANCE  # alpha / rank travelled in the file's metadata
    assert (untrained - ours).abs().max() > 1e-3  # the trained adapter changes the samples


def test_guided_sampling_carries_the_condition_image_into_both_halves_as_the_pipelines_true_cfg(
    kontext_dir: Path,
) -> None:
    from vgrpo.flow import timestep_grid
    from vgrpo.samplers import ClassifierFreeGuidance, euler_ode_sample

    pipe = load_pipeline(kontext_dir / "pipeline")
    adapter, policy = build_adapter(pipe, resolution=16)
    noise = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(2))
    packed = pipe(
        image=[load_condition_image(kontext_dir / f"source{i}.png") for i in range(2)],
        prompt=list(PROMPTS),
        negative_prompt=["", ""],
        true_cfg_scale=3.0,
        height=16,
        width=16,
        max_area=16 * 16,
        _auto_resize=False,
        num_inference_steps=3,
        guidance_scale=KONTEXT_GUIDANCE,
        latents=pack_latents(noise),
        output_type="latent",
        max_sequence_length=16,
    ).images
    guided = ClassifierFreeGuidance(policy, adapter.encode_prompts([""]), 3.0)
    with torch.no_grad():
        ours = euler_ode_sample(
            guided, noise, adapter.encode_rows(_rows(kontext_dir)), timestep_grid(3, shift=adapter.scheduler_shift)
        )
    assert (ours - unpack_latents(packed, 8, 8)).abs().max() <= LATENT_TOLERANCE


def test_the_kontext_recipe_loads_as_a_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    from vgrpo.config import StageConfig, load_config

    monkeypatch.setenv("VGRPO_MODELS", "/models")
    root = Path(__file__).parents[2] / "params"
    stage = {"name": "kontext-edit", "prompts": "edits/train.jsonl", "iterations": 1}
    stage["rewards"] = [{"name": "source_similarity"}]
    config = load_config([root / "base.yaml", root / "models/flux-kontext.yaml"], stage, schema=StageConfig)
    assert str(config.pipeline) == "/models/FLUX.1-Kontext-dev"
    rollout, lora = config.rollout, config.lora
    assert (rollout.resolution, rollout.num_steps, rollout.shift, rollout.dynamic_shift) == (512, 6, None, True)
    assert (rollout.prompts_per_iteration, rollout.group_size, config.optim.lr) == (48, 21, 3e-4)
    assert lora is not None and (lora.rank, lora.alpha) == (64, 128)
    assert set(FAMILIES["flux-kontext"].lora_targets) <= set(lora.target_modules)
    assert (config.evaluation.num_steps, config.evaluation.shift) == (28, "dynamic")
    # Every target names modules of the transformer (the tiny one has FLUX.1's structure).
    names = [n for n, _ in tiny_flux_kontext_pipeline(seed=0).transformer.named_modules()]
    assert all(any(n.endswith(t) for n in names) for t in lora.target_modules)
