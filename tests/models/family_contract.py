"""The contract every model family's tests share (diffusers' ``PipelineTesterMixin`` pattern): a family's test file
subclasses :class:`FamilyContract` (and its stage file :class:`FamilyStageContract`) with a few lines of what is its
own (its tiny pipeline, how the diffusers pipeline samples latents, what its recipe says), and inherits the tests.

:class:`FamilyContract`, on a tiny pipeline saved once per class: sampling with the project's sampler reproduces the
diffusers pipeline's ``__call__`` (and the sigma grid its scheduler's); two iterations of V-GRPO and of Flow-GRPO move
only the LoRA, on the modules the family names; the exported LoRA, loaded by a plain diffusers pipeline, samples what
the project samples; the family's params file loads as a stage training the family's LoRA targets.

:class:`FamilyStageContract`, on the world's prompt files beside the tiny pipeline: a whole stage trains it (LoRA and
full fine-tuning; the final evaluation at the family's shift; the export loads), a killed stage resumes to the same
weights bit for bit, and (CUDA only) the stage trains at the newer families' recipe precision.
"""

from __future__ import annotations

import math
from operator import attrgetter
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from tests.models.family_stage import (
    assert_export_loads,
    assert_killed_stage_resumes,
    assert_trains_at_recipe_precision,
    full_fine_tuning,
    run_two_iterations,
    stage_config,
    world_with_pipeline,
)
from tests.models.family_training import train_two_iterations
from vgrpo.models.pipeline import build_adapter, load_pipeline
from vgrpo.models.registry import FAMILIES

PROMPTS = ["a photo of a red circle", "two blue squares"]
PARAMS = Path(__file__).parents[2] / "params"
LARGE_DYNAMIC_SHIFT_RECIPE: dict[str, Any] = {
    "precision.lora_base_dtype": "bf16",  # fp32 would not fit (benchmarks.memory_families)
    "rollout.resolution": 512,
    "rollout.shift": None,
    "rollout.dynamic_shift": True,
    "rollout.prompts_per_iteration": 48,
    "rollout.group_size": 16,
    "optim.lr": 3e-4,
    "evaluation.resolution": 1024,
    "evaluation.num_steps": 28,
    "evaluation.shift": "dynamic",
}
"""What the FLUX.2 and Qwen-Image recipes (params/models/flux2.yaml, qwen-image.yaml) give alike: a bf16 LoRA base,
48 x 16 rollouts at 512 px with the pipeline's dynamic shift, lr 3e-4, and evaluation at 1024 px in 28 steps."""


class FamilyContract:
    """The family tests (module docstring); a subclass sets the class attributes and the two methods."""

    family: ClassVar[str]
    """The family's name in the registry (its params file is ``params/models/<family>.yaml``)."""
    noise_shape: ClassVar[tuple[int, ...]]
    """The latents of two 16 px samples."""
    trained: ClassVar[frozenset[str]]
    """Module names two training iterations must move (the LoRA's on them)."""
    shift: ClassVar[float | None] = None
    """The training's static sigma shift; None = the pipeline's dynamic one."""
    tolerance: ClassVar[float] = 1e-5
    """Max-abs difference allowed between this project's sampler and the pipeline's ``__call__`` on the same noise."""
    recipe: ClassVar[dict[str, Any]]
    """Dotted config path -> what the family's params file (on ``params/base.yaml``) gives it."""
    extra_lora_targets: ClassVar[tuple[str, ...]] = ()
    """Targets the recipe trains after the family's own (its feed-forward layers, say)."""

    @staticmethod
    def tiny_pipeline() -> Any:
        """The family's tiny pipeline, built offline (seed 0)."""
        raise NotImplementedError

    def pipeline_latents(self, pipe: Any, noise: torch.Tensor, steps: int) -> torch.Tensor:
        """The pipeline's own ``__call__``'s final latents for :data:`PROMPTS` at 16 px from ``noise``, in the
        adapter's layout."""
        raise NotImplementedError

    @staticmethod
    def call_pipeline(pipe: Any, latents: torch.Tensor, steps: int, **kwargs: Any) -> Any:
        """``pipe``'s ``__call__`` for :data:`PROMPTS` (a fresh list: ZImagePipeline writes the chat-templated prompts
        into the one it is given) at 16 px in ``steps`` steps from ``latents`` (in the pipeline's layout), with
        ``kwargs``, the family's further arguments: its output, whose ``images`` are the final latents."""
        return pipe(
            prompt=list(PROMPTS),
            height=16,
            width=16,
            num_inference_steps=steps,
            latents=latents,
            output_type="latent",
            **kwargs,
        )

    def after_export(self, saved: Path, lora: Path, noise: torch.Tensor, ours: torch.Tensor) -> None:
        """More checks of the exported LoRA directory ``lora`` (``ours``: the project's samples from ``noise``)."""

    @pytest.fixture(scope="class")
    @classmethod
    def saved(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        path = tmp_path_factory.mktemp(cls.family) / "pipeline"
        cls.tiny_pipeline().save_pretrained(path)
        return path

    def train(self, pipe: Any, algorithm_name: str) -> tuple[Any, Any, dict[str, torch.Tensor], list[Any]]:
        return train_two_iterations(pipe, self.family, algorithm_name, PROMPTS, shift=self.shift)

    @pytest.mark.parametrize("steps", [2, 4])
    def test_euler_with_the_family_s_velocity_reproduces_its_pipeline(self, saved: Path, steps: int) -> None:
        from vgrpo.flow import timestep_grid
        from vgrpo.samplers import euler_ode_sample

        pipe = load_pipeline(saved)
        adapter, policy = build_adapter(pipe, resolution=16)
        noise = torch.randn(*self.noise_shape, generator=torch.Generator().manual_seed(0))
        reference = self.pipeline_latents(pipe, noise, steps)
        sigmas = timestep_grid(steps, shift=adapter.pipeline_shift(steps))
        torch.testing.assert_close(sigmas, pipe.scheduler.sigmas, rtol=0, atol=1e-6)
        with torch.no_grad():
            ours = euler_ode_sample(policy, noise, adapter.encode_prompts(PROMPTS), sigmas)
        assert (ours - reference).abs().max() <= self.tolerance
        assert (reference - noise).abs().max() > 0.5  # the sampler moved the latents: the comparison can fail

    @pytest.mark.parametrize("algorithm_name", ["vgrpo", "flow_grpo"])
    def test_rollout_score_update_moves_the_lora(self, saved: Path, algorithm_name: str) -> None:
        _, policy, before, records = self.train(load_pipeline(saved), algorithm_name)
        after = policy.state_dict()
        changed = {k for k in before if not torch.equal(before[k], after[k])}
        assert changed and all("lora" in k for k in changed) and any("lora_B" in k for k in changed)
        assert self.trained <= {part for k in changed for part in k.split(".")}
        assert all(math.isfinite(r.metrics["train/loss"]) for r in records)

    def test_exported_lora_in_a_plain_pipeline_samples_what_the_project_samples(
        self, saved: Path, tmp_path: Path
    ) -> None:
        from vgrpo.checkpoints.state import LORA_FILE, save_lora
        from vgrpo.flow import timestep_grid
        from vgrpo.samplers import euler_ode_sample

        pipeline_class = FAMILIES[self.family].diffusers_pipeline()
        pipe = load_pipeline(saved)
        adapter, policy, _, _ = self.train(pipe, "vgrpo")
        save_lora(pipe.transformer, tmp_path / "lora")
        assert (tmp_path / "lora" / LORA_FILE).is_file()

        plain = pipeline_class.from_pretrained(saved, local_files_only=True)
        plain.load_lora_weights(tmp_path / "lora")
        base = pipeline_class.from_pretrained(saved, local_files_only=True)
        noise = torch.randn(*self.noise_shape, generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            sigmas = timestep_grid(4, shift=adapter.pipeline_shift(4))
            ours = euler_ode_sample(policy, noise, adapter.encode_prompts(PROMPTS), sigmas)
        theirs, untrained = self.pipeline_latents(plain, noise, 4), self.pipeline_latents(base, noise, 4)
        assert (theirs - ours).abs().max() <= self.tolerance  # alpha / rank travelled in the file's metadata
        assert (untrained - ours).abs().max() > 1e-3  # the trained adapter changes the samples
        self.after_export(saved, tmp_path / "lora", noise, ours)

    def test_the_recipe_loads_as_a_stage_and_trains_the_family_s_lora_targets(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from vgrpo.config import StageConfig, load_config

        monkeypatch.setenv("VGRPO_MODELS", "/models")
        stage = {"name": f"{self.family}-pickscore", "prompts": "prompts/flow_grpo/pickscore/train.txt"}
        stage |= {"iterations": 1, "rewards": [{"name": "pickscore", "options": {"path": "/models/PickScore_v1"}}]}
        files = [PARAMS / "base.yaml", PARAMS / f"models/{self.family}.yaml"]
        config = load_config(files, stage, schema=StageConfig)
        assert {key: attrgetter(key)(config) for key in self.recipe} == self.recipe
        lora, family = config.lora, FAMILIES[self.family]
        assert lora is not None and (lora.rank, lora.alpha) == (64, 128)
        assert lora.targets(family.lora_targets) == (*family.lora_targets, *self.extra_lora_targets)


class FamilyStageContract:
    """The family's stage tests (module docstring); a subclass sets the class attributes and :meth:`tiny_pipeline`."""

    family: ClassVar[str]
    shift: ClassVar[float | None] = None
    """The stage's static sigma shift; None = the pipeline's dynamic one."""
    evaluation_shift: ClassVar[float]
    """The shift the final evaluation samples at (its 2 steps, 16 px)."""

    @staticmethod
    def tiny_pipeline(prompts: list[str]) -> Any:
        """The family's tiny pipeline, built offline (its tokenizers may be built from the world's ``prompts``)."""
        raise NotImplementedError

    @pytest.fixture(scope="class")
    @classmethod
    def world(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        """World prompt files and the family's tiny pipeline beside them (``base``)."""
        return world_with_pipeline(tmp_path_factory.mktemp(f"{cls.family}-world"), cls.tiny_pipeline)

    def config(self, **overrides: Any) -> Any:
        return stage_config(self.family, shift=self.shift, **overrides)

    @pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
    def test_run_stage_trains_a_saved_pipeline(self, world: Path, lora: bool) -> None:
        config = self.config()
        result = run_two_iterations(world, config if lora else full_fine_tuning(config), f"{lora}")
        assert result.evaluations[-1]["sampling"]["shift"] == pytest.approx(self.evaluation_shift)
        assert_export_loads(world, f"{lora}", FAMILIES[self.family].diffusers_pipeline(), lora=lora)

    def test_a_killed_stage_resumes_to_the_same_weights(self, world: Path) -> None:
        assert_killed_stage_resumes(world, self.config(eval_prompts=None))

    @pytest.mark.gpu
    def test_a_stage_trains_on_cuda_at_the_newer_families_precision(self, world: Path) -> None:
        assert_trains_at_recipe_precision(world, self.config(), FAMILIES[self.family].diffusers_pipeline())
