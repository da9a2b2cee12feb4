"""FLUX.1 in the pipeline, on a tiny FluxPipeline built offline: the FLUX params, the family's stage contract (a stage
on a saved directory), hybrid sampling, and evaluation at its own resolution with the dynamic shift recomputed there."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.models.family_contract import FamilyStageContract
from tests.models.family_stage import stage_config, world_with_pipeline
from vgrpo.flow import timestep_grid
from vgrpo.models.flux import FluxAdapter, FluxVelocity
from vgrpo.models.pipeline import build_adapter, load_pipeline
from vgrpo.models.tiny import tiny_flux_pipeline

ROOT = Path(__file__).parents[2]
PROMPTS = ["a photo of a red circle", "two blue squares"]


def test_flux_params_validate() -> None:
    from vgrpo.config import StageConfig, load_config

    files = ["base.yaml", "models/flux.yaml", "stages/flux/multireward.yaml"]
    config = load_config([ROOT / "params" / f for f in files], schema=StageConfig)
    assert not config.rollout.dynamic_shift and config.rollout.shift == 3.0 and config.rollout.resolution == 720
    assert config.evaluation.resolution == 1024 and config.evaluation.shift == "dynamic"
    dynamic = load_config(
        [ROOT / "params" / f for f in files], {"rollout": {"shift": None, "dynamic_shift": True}}, schema=StageConfig
    )
    assert dynamic.rollout.dynamic_shift  # FluxPipeline's own shift is one override away
    assert config.lora is None and config.evaluation.p_mix == 0.8
    from vgrpo.algorithms.config import RolloutConfig

    with pytest.raises(ValueError, match="set shift to null"):
        RolloutConfig(dynamic_shift=True, shift=3.0)


@pytest.fixture(scope="module")
def flux_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """World prompt files and a tiny FLUX pipeline whose tokenizers were built from them."""
    build = partial(tiny_flux_pipeline, seed=0)
    return world_with_pipeline(tmp_path_factory.mktemp("flux-world"), lambda prompts: build(corpus=prompts))


class TestFluxStage(FamilyStageContract):
    """The family's stage contract (tests/models/family_contract.py) on the FLUX world: a stage trains its LoRA or
    every weight and exports them, a killed stage resumes bit for bit, and CUDA trains it at the recipe precision."""

    family = "flux"
    evaluation_shift = math.exp(0.459375)

    @pytest.fixture(scope="class")
    @classmethod
    def world(cls, flux_world: Path) -> Path:
        return flux_world


def test_hybrid_sampling_runs_through_the_flux_adapter(flux: Any) -> None:
    from vgrpo.evaluation.evaluator import Sampling, generate

    adapter, policy = build_adapter(flux, resolution=16)
    base = FluxVelocity(tiny_flux_pipeline(seed=1).transformer)  # other weights, same shapes

    def sample(base: Any = None, p_mix: float | None = None) -> torch.Tensor:
        images, _ = generate(
            encode=adapter.encode_prompts,
            decode=lambda z: z.numpy(),
            policy=policy.eval(),
            prompts=PROMPTS,
            latent_shape=adapter.latent_shape,
            base=base,
            sampling=Sampling(4, 0, adapter.scheduler_shift, p_mix=p_mix),
        )
        return torch.from_numpy(images)

    alone, base_alone = sample(), sample(base=base.eval(), p_mix=0.0)
    assert torch.equal(sample(base=base, p_mix=1.0), alone)
    mixed = sample(base=base, p_mix=0.5)  # the policy's first 2 steps, the base's last 2
    assert (mixed - alone).abs().max() > 1e-3 and (mixed - base_alone).abs().max() > 1e-3


def test_evaluate_refuses_a_base_pipeline_of_another_family(
    saved_flux: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.models.test_embedded import TINY
    from vgrpo.cli import main
    from vgrpo.models.embedded import build_pipeline, train_clip_tokenizer
    from vgrpo.world import write_jsonl

    build_pipeline(TINY, train_clip_tokenizer(PROMPTS, TINY)).save_pretrained(tmp_path / "sd3")
    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": p} for p in PROMPTS])
    code = main(
        [
            "evaluate",
            str(saved_flux),
            "--prompts",
            str(tmp_path / "prompts.jsonl"),
            "--out",
            str(tmp_path / "eval.json"),
            "--params",
            str(ROOT / "params/embedded/evaluate.yaml"),
            "--set",
            "p_mix=0.5",
            f"base_pipeline={tmp_path / 'sd3'}",
        ]
    )
    assert code == 2 and not (tmp_path / "eval.json").exists()
    assert "is a StableDiffusion3Pipeline, the evaluated pipeline a FluxPipeline" in capsys.readouterr().err


def test_build_algorithm_refuses_an_unresolved_dynamic_shift(tiny_sd3_policy: torch.nn.Module) -> None:
    """The dynamic shift depends on the adapter's token count: an unresolved one must not become an unshifted grid."""
    from vgrpo.algorithms import build_algorithm
    from vgrpo.config import load_config

    config = load_config(overrides={"rollout": {"shift": None, "dynamic_shift": True}})
    with pytest.raises(ValueError, match="dynamic_shift must be resolved"):
        build_algorithm(config, policy=tiny_sd3_policy, latent_shape=(4, 8, 8))
    # The resolved shift is an argument (setup_policy passes the adapter's), not a copy of the config.
    resolved = build_algorithm(config, policy=tiny_sd3_policy, latent_shape=(4, 8, 8), shift=1.5)
    grid = timestep_grid(config.rollout.num_steps, shift=1.5, schedule=config.rollout.schedule)
    assert torch.equal(resolved.sigmas, grid) and config.rollout.dynamic_shift and config.rollout.shift is None


def _mu(tokens: int) -> float:
    """diffusers' calculate_shift with FLUX.1's scheduler defaults (base 0.5 at 256 tokens, max 1.15 at 4096)."""
    return 0.5 + (tokens - 256) * 0.65 / 3840


def test_evaluator_resizes_the_adapter_and_recomputes_the_dynamic_shift(flux: Any) -> None:
    from vgrpo.evaluation.config import EvaluationConfig
    from vgrpo.evaluation.evaluator import Evaluator

    rollout = FluxAdapter(flux, resolution=16)  # 8 x 8 latents: 16 tokens
    rollout_shift = rollout.scheduler_shift
    assert rollout_shift == pytest.approx(math.exp(_mu(16)))

    def sampling(dynamic: bool, **evaluation: Any) -> tuple[Any, Any]:
        config = EvaluationConfig(**evaluation)
        shift = rollout_shift if dynamic else 3.0
        evaluator = Evaluator(rows=[], rewards=None, config=config, shift=shift, dynamic_shift=dynamic)  # type: ignore[arg-type]
        return evaluator.sampling(rollout)

    adapter, s = sampling(True, resolution=32)  # 16 x 16 latents: 64 tokens, mu 0.4675
    assert adapter.latent_shape == (4, 16, 16) and adapter.image_seq_len == 64 and adapter.pipe is flux
    assert s.shift == pytest.approx(math.exp(0.4675), abs=1e-12)
    assert s.shift == FluxAdapter(flux, resolution=32).scheduler_shift  # what FluxPipeline samples 32 px with
    assert rollout.latent_shape == (4, 8, 8)  # the rollout's adapter is left as it was
    adapter.encode_prompts([PROMPTS[0]])
    assert PROMPTS[0] in rollout.prompt_cache and adapter.prompt_cache is rollout.prompt_cache  # one cache
    adapter, s = sampling(True)  # no evaluation resolution: the rollout's adapter and shift
    assert adapter is rollout and s.shift == rollout_shift
    assert sampling(False, resolution=32)[1].shift == 3.0  # a static rollout shift stays static
    assert sampling(False, resolution=64, shift="dynamic")[1].shift == pytest.approx(math.exp(_mu(256)))
    assert sampling(True, resolution=32, shift=3.0)[1].shift == 3.0
    with pytest.raises(ValueError, match=r"evaluation\.resolution 18 px is not a positive multiple of 4"):
        sampling(True, resolution=18)


def test_stage_evaluation_samples_at_the_evaluation_resolution_and_its_shift(flux_world: Path) -> None:
    from vgrpo.evaluation.evaluator import Sampling, generate
    from vgrpo.images import tensor_to_images
    from vgrpo.training.phases import evaluate_adapter

    evaluation = {"group_size": 1, "num_steps": 2, "max_prompts": 2, "rewards": [{"name": "geneval"}]}
    at_rollout = evaluate_adapter(stage_config("flux", evaluation=evaluation), flux_world / "base", None, flux_world, 0)
    at_32 = evaluate_adapter(
        stage_config("flux", evaluation=evaluation | {"resolution": 32}), flux_world / "base", None, flux_world, 0
    )
    assert at_rollout is not None and at_32 is not None
    (table_16, images_16), (table_32, images_32) = at_rollout, at_32
    assert images_16.shape == (2, 16, 16, 3) and images_32.shape == (2, 32, 32, 3)
    assert table_16["sampling"]["shift"] == pytest.approx(math.exp(_mu(16)), abs=1e-12)
    assert table_32["sampling"]["shift"] == pytest.approx(math.exp(_mu(64)), abs=1e-12)
    # The same images as sampling a 32 px adapter directly with FluxPipeline's own shift at 32 px.
    adapter, policy = build_adapter(load_pipeline(flux_world / "base"), resolution=32)
    prompts = table_32["per_prompt"]["prompt"]
    direct, _ = generate(
        encode=adapter.encode_prompts,
        decode=lambda z: tensor_to_images(adapter.decode(z)),
        policy=policy.eval(),
        prompts=prompts,
        latent_shape=adapter.latent_shape,
        sampling=Sampling(2, 0, adapter.scheduler_shift),
    )
    assert np.array_equal(direct, images_32)
