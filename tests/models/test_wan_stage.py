"""Wan2.1 in the pipeline, on a tiny WanPipeline built offline: a stage samples 5-frame videos (rollout.num_frames),
scores every frame with an image reward averaged per video, evaluates and draws its videos' frames in the grid,
exports a LoRA a plain WanPipeline loads, and a killed stage resumes to bit-identical LoRA weights; an image family
refuses rollout.num_frames."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.models import family_stage
from vgrpo.models.tiny_wan import TINY_WAN_FRAMES, TINY_WAN_RESOLUTION, tiny_wan_pipeline

PROMPTS = ("a cat walking on grass", "a red car driving at night", "waves on a beach")


@pytest.fixture(scope="module")
def video_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wan-world")
    (root / "train.txt").write_text("".join(p + "\n" for p in PROMPTS))
    (root / "test.txt").write_text(PROMPTS[0] + "\n")
    tiny_wan_pipeline(seed=0).save_pretrained(root / "base")
    return root


def _stage_config(**overrides: Any) -> Any:
    brightness = [{"name": "tests.rewards.custom:Brightness", "key": "brightness"}]
    data: dict[str, Any] = {
        "rollout": {"resolution": TINY_WAN_RESOLUTION, "num_frames": TINY_WAN_FRAMES},
        "prompts": "train.txt",
        "rewards": brightness,
        "eval_prompts": "test.txt",
        "evaluation": {"group_size": 2, "num_steps": 2, "num_frames": 9, "rewards": brightness},
    }
    return family_stage.stage_config("wan", shift=3.0, **(data | overrides))


def test_a_wan_stage_trains_on_videos_scored_per_frame_and_exports_its_lora(
    video_world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from diffusers import WanPipeline

    from vgrpo.models.wan import WanVelocity

    shapes = family_stage.spy_on_forward(monkeypatch, WanVelocity, lambda latents, cond: tuple(latents.shape[1:]))
    result = family_stage.run_two_iterations(video_world, _stage_config(), "videos")  # two finite iterations
    assert all(0.0 < h["reward/brightness_raw_mean"] < 1.0 for h in result.history)
    final = result.evaluations[-1]
    assert final["iteration"] == 2 and 0.0 < final["rewards"]["brightness"]["mean"] < 1.0
    # Rollouts and updates saw 5 frames' 2 latent frames of 4 x 4; the evaluation 9 frames' 3.
    assert len(shapes) > 10 and set(shapes) == {(4, 2, 4, 4), (4, 3, 4, 4)} and shapes[-1] == (4, 3, 4, 4)
    family_stage.assert_export_loads(video_world, "videos", WanPipeline, lora=True)


def test_a_killed_wan_stage_resumes_to_the_same_weights(video_world: Path) -> None:
    family_stage.assert_killed_stage_resumes(video_world, _stage_config(eval_prompts=None))


def test_an_image_family_refuses_num_frames() -> None:
    from vgrpo.errors import ConfigError
    from vgrpo.evaluation.evaluator import resized_adapter
    from vgrpo.models.pipeline import build_adapter
    from vgrpo.models.tiny import tiny_flux_pipeline

    pipe = tiny_flux_pipeline(seed=0)
    with pytest.raises(ConfigError, match=r"rollout\.num_frames is for video families; 'flux' samples images"):
        build_adapter(pipe, resolution=16, num_frames=5)
    with pytest.raises(ValueError, match=r"evaluation\.num_frames is for video families; FluxAdapter samples images"):
        resized_adapter(build_adapter(pipe, resolution=16)[0], None, 5)


def test_the_evaluation_resizes_a_wan_adapter_in_time_and_space_sharing_its_prompt_cache(video_world: Path) -> None:
    from vgrpo.evaluation.evaluator import resized_adapter
    from vgrpo.models.pipeline import build_adapter, load_pipeline

    adapter = build_adapter(load_pipeline(video_world / "base"), resolution=TINY_WAN_RESOLUTION, num_frames=5)[0]
    assert resized_adapter(adapter, None, None) is adapter and resized_adapter(adapter, None, 5) is adapter
    other = resized_adapter(adapter, 16, 13)
    assert other.latent_shape == (4, 4, 2, 2) and adapter.latent_shape == (4, 2, 4, 4)
    assert other.prompt_cache is adapter.prompt_cache
    with pytest.raises(ValueError, match=r"evaluation\.num_frames 7 is not 4k \+ 1"):
        resized_adapter(adapter, None, 7)


def test_preflight_refuses_frames_the_vae_cannot_take_before_loading_a_weight(video_world: Path) -> None:
    from vgrpo.models.folder import read_geometry
    from vgrpo.training.preflight import preflight

    rollout = _stage_config().rollout.model_dump() | {"num_frames": 6}
    evaluation = _stage_config().evaluation.model_dump() | {"num_frames": 11}
    config = _stage_config(pipeline="base", rollout=rollout, evaluation=evaluation)
    messages = [p.message for p in preflight([config], video_world)]
    assert any("rollout.num_frames: 6 frames is not 4k + 1" in m and "nearest: 5 or 9" in m for m in messages)
    assert any("evaluation.num_frames: 11 frames is not 4k + 1" in m and "nearest: 9 or 13" in m for m in messages)
    assert not [p for p in preflight([_stage_config(pipeline="base")], video_world) if "num_frames" in p.message]
    geometry = read_geometry(video_world / "base")
    assert geometry is not None and geometry.frames_factor == 4 and geometry.frames_problem(None, "k") is None
    image = type(geometry)(video_world / "flux", 8, 2, 1024, None)
    assert image.frames_problem(5, "rollout.num_frames") == (
        f"rollout.num_frames: {video_world / 'flux'} samples images; num_frames is for video families (remove it)"
    )


@pytest.mark.gpu
def test_a_wan_stage_trains_on_cuda_at_the_newer_families_precision(video_world: Path) -> None:
    from diffusers import WanPipeline

    family_stage.assert_trains_at_recipe_precision(video_world, _stage_config(), WanPipeline)
