"""A curriculum stage as plain functions on a tiny embedded pipeline: prompts and randomness per iteration,
LoRA export that diffusers loads, and a killed stage that resumes to the same weights as an uninterrupted one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.tiny_world import Recorder, run_tiny_stage, run_whole_and_killed, write_tiny_world
from tests.tiny_world import tiny_stage_config as _config
from vgrpo.training.phases import iteration_generator
from vgrpo.training.prompt_rows import sample_prompt_rows
from vgrpo.training.stage import run_stage


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_world(tmp_path_factory.mktemp("world"))


def test_iteration_randomness_depends_only_on_seed_and_iteration() -> None:
    rows = [{"prompt": str(i)} for i in range(10)]
    assert sample_prompt_rows(rows, 4, 0, 3) == sample_prompt_rows(rows, 4, 0, 3) != sample_prompt_rows(rows, 4, 0, 4)
    assert len({r["prompt"] for r in sample_prompt_rows(rows, 10, 1, 0)}) == 10  # without replacement
    a, b = iteration_generator(0, 5), iteration_generator(0, 5)
    assert torch.equal(torch.randn(3, generator=a), torch.randn(3, generator=b))


def test_tag_weights_set_each_tags_share_of_the_drawn_prompts() -> None:
    rows = [{"prompt": f"a{i}", "tag": "a"} for i in range(900)] + [{"prompt": f"b{i}", "tag": "b"} for i in range(100)]
    drawn = [r["tag"] for it in range(400) for r in sample_prompt_rows(rows, 8, 0, it, {"a": 1.0, "b": 3.0})]
    assert drawn.count("b") / len(drawn) == pytest.approx(0.75, abs=0.03)  # uniform over rows would give 0.10
    assert sample_prompt_rows(rows, 8, 0, 7, {"a": 1.0, "b": 3.0}) == sample_prompt_rows(
        rows, 8, 0, 7, {"a": 1, "b": 3}
    )


def test_tag_weights_must_cover_every_kept_tag(world: Path) -> None:
    config = _config(prompt_tag_weights={"single_object": 1.0})
    with pytest.raises(ValueError, match="no weight for the tags"):
        run_tiny_stage(config, world, "run", "lora")
    with pytest.raises(ValueError, match="must all be > 0"):
        _config(prompt_tag_weights={"single_object": 0.0})


def test_stage_exports_lora_that_diffusers_loads(world: Path) -> None:
    from diffusers import StableDiffusion3Pipeline

    from vgrpo.checkpoints.state import load_lora_into
    from vgrpo.models import add_lora

    recorder = Recorder()
    result = run_tiny_stage(_config(), world, "run", "lora", callbacks=recorder)
    assert [i for i, _ in recorder.logged] == [0, 1, 2] and len(result.history) == 3
    assert {"reward/geneval_mean", "reward/geneval/strict_mean", "train/grad_norm", "surrogate/cv"} <= set(
        result.history[0]
    )
    assert result.evaluations[-1]["iteration"] == 3 and "geneval" in result.evaluations[-1]["rewards"]
    # A plain diffusers script loads the export and reproduces our adapted transformer.
    plain = StableDiffusion3Pipeline.from_pretrained(world / "base", text_encoder_3=None, tokenizer_3=None)
    plain.load_lora_weights(world / "lora")
    ours = StableDiffusion3Pipeline.from_pretrained(world / "base", text_encoder_3=None, tokenizer_3=None).transformer
    add_lora(ours, rank=4, alpha=8, target_modules=_config().lora.target_modules)  # type: ignore[union-attr]
    load_lora_into(ours, world / "lora")
    x = torch.randn(2, 4, 8, 8)
    enc, pooled, t = torch.randn(2, 20, 32), torch.randn(2, 16), torch.tensor([500.0, 300.0])
    kw = {"hidden_states": x, "encoder_hidden_states": enc, "pooled_projections": pooled, "timestep": t}
    with torch.no_grad():
        base_out = (
            StableDiffusion3Pipeline.from_pretrained(world / "base", text_encoder_3=None, tokenizer_3=None)
            .transformer(**kw)
            .sample
        )
        torch.testing.assert_close(plain.transformer(**kw).sample, ours(**kw).sample)
    assert not torch.allclose(base_out, ours(**kw).sample)  # training changed the adapter


def test_a_stage_mixing_tasks_scores_each_prompt_by_its_own_reward(world: Path) -> None:
    """Batches of two tags, each scored by a reward that applies to its tag alone: no error for the prompts a reward
    does not score, and each reward's metrics over the prompts it does (V-GRPO's advantages per reward and group)."""
    tagged = "tests.rewards.custom:TaggedBrightness"
    config = _config(
        prompt_tags=["single_object", "counting"],
        rollout={"prompts_per_iteration": 4, "group_size": 2, "num_steps": 4, "shift": None, "micro_batch_size": 8},
        rewards=[
            {"name": tagged, "key": "bright", "options": {"tags": ["single_object"]}},
            {"name": tagged, "key": "dark", "options": {"tags": ["counting"], "gain": -1.0}},
        ],
        eval_prompts=None,
    )
    result = run_tiny_stage(config, world, "mixed", "mixed-lora")
    fractions = [
        (h.get("reward/bright_scored_frac", 1.0), h.get("reward/dark_scored_frac", 1.0)) for h in result.history
    ]
    assert len(fractions) == 3 and all(b + d == pytest.approx(1.0) for b, d in fractions)  # each prompt, one reward
    assert any(0 < b < 1 for b, _ in fractions)  # some batch held both tags
    assert all(h["reward/dark_mean"] <= 0 for h in result.history if "reward/dark_mean" in h)


def test_killed_stage_resumes_to_the_same_weights(world: Path) -> None:
    from safetensors.torch import load_file

    cfg = _config(eval_prompts=None)
    run_whole_and_killed(cfg, world)
    resumed = run_tiny_stage(cfg, world, "cut", "cut_lora")
    assert resumed.resumed_from == 1  # iteration 1 died before its checkpoint
    a = load_file(world / "whole_lora" / "pytorch_lora_weights.safetensors")
    b = load_file(world / "cut_lora" / "pytorch_lora_weights.safetensors")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    other = _config(eval_prompts=None, seed=1)
    fresh = run_tiny_stage(other, world, "cut", "o")
    assert fresh.resumed_from == 0  # a checkpoint written with other params is not resumed
    assert np.isfinite([h["reward/pickscore_mean"] for h in resumed.history]).all()


def test_a_stage_takes_the_same_steps_with_and_without_callbacks(world: Path) -> None:
    """Callbacks only listen: the recorder hears every log, evaluation and checkpoint, and the weights, history and
    evaluations are those of a stage run without one."""
    cfg = _config(eval_every=2)
    plain = run_tiny_stage(cfg, world, "plain", "plain_lora")
    recorder = Recorder()
    heard = run_tiny_stage(cfg, world, "heard", "heard_lora", callbacks=recorder)
    lora = "pytorch_lora_weights.safetensors"
    assert (world / "plain_lora" / lora).read_bytes() == (world / "heard_lora" / lora).read_bytes()

    def untimed(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in row.items() if not k.startswith("time/") and k != "seconds"} for row in rows]

    assert untimed(heard.history) == untimed(plain.history) and len(plain.history) == 3
    assert untimed(heard.evaluations) == untimed(plain.evaluations)
    assert [e["iteration"] for e in plain.evaluations] == [0, 2, 3]
    assert [m for _, m in recorder.logged] == heard.history and [i for i, _ in recorder.logged] == [0, 1, 2]
    assert [t for _, t in recorder.evaluated] == heard.evaluations and [i for i, _ in recorder.evaluated] == [0, 2, 3]
    assert [(i, p.name) for i, p in recorder.checkpoints] == [(1, "iter-1"), (2, "iter-2"), (3, "iter-3")]
    assert recorder.skips == heard.skipped == []


@pytest.mark.parametrize("shorthand", ["log", "on_eval", "on_skip"])
def test_run_stage_takes_callbacks_only_as_a_stage_callbacks_object(world: Path, shorthand: str) -> None:
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{shorthand}'"):
        run_stage(
            _config(),
            pipeline_dir=Path("base"),
            work_dir=world / "none",
            out_dir=world / "none_lora",
            root=world,
            **{shorthand: print},
        )
    assert not (world / "none").exists()


def test_a_stage_does_not_resume_across_a_changed_starting_adapter(world: Path) -> None:
    """Re-running a curriculum's earlier stage with other params rewrites its adapter at the same path; the next
    stage must then start over, not resume (or re-export) what it trained from the old adapter."""
    cfg, short = _config(eval_prompts=None, iterations=2), _config(eval_prompts=None, iterations=1)
    run_tiny_stage(short, world, "p1", "prev")
    first = run_tiny_stage(cfg, world, "next", "next_lora", init_lora=Path("prev"))
    again = run_tiny_stage(cfg, world, "next", "next_lora", init_lora=Path("prev"))
    assert first.resumed_from == 0 and again.resumed_from == 2  # same start: the finished run is reused
    other = _config(eval_prompts=None, iterations=1, seed=1)
    run_tiny_stage(other, world, "p2", "prev")
    changed = run_tiny_stage(cfg, world, "next", "next_lora", init_lora=Path("prev"))
    assert changed.resumed_from == 0


def test_stage_config_errors() -> None:
    with pytest.raises(ValueError, match=r"rewards\[\]\.weight"):
        _config(advantage={"weights": {"geneval": 1.0}})
    with pytest.raises(ValueError, match="unknown reward"):
        _config(rewards=[{"name": "nope"}])


def test_safetensors_header_is_canonical_whatever_order_it_was_written_in(tmp_path: Path) -> None:
    """safetensors writes ``__metadata__`` from a Rust hash map (its order varies by process); stage outputs are
    identified by content hash, so save_lora rewrites the header with sorted keys."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    from vgrpo.checkpoints.state import canonicalize_safetensors_header

    tensors = {"b.weight": torch.arange(6.0).reshape(2, 3), "a.weight": torch.ones(3, dtype=torch.float16)}
    save_file(tensors, tmp_path / "x.safetensors", metadata={"format": "pt", "lora_adapter_metadata": "{}"})
    raw = (tmp_path / "x.safetensors").read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    reordered = {"__metadata__": dict(reversed(list(header.pop("__metadata__").items()))), **header}
    text = json.dumps(reordered).encode()  # another order, other spacing, no padding
    (tmp_path / "y.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + size :])
    for name in ("x", "y"):
        canonicalize_safetensors_header(tmp_path / f"{name}.safetensors")
    x, y = ((tmp_path / f"{n}.safetensors").read_bytes() for n in ("x", "y"))
    assert x == y and int.from_bytes(x[:8], "little") % 8 == 0
    with safe_open(tmp_path / "x.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt", "lora_adapter_metadata": "{}"}
        for key, value in tensors.items():
            assert torch.equal(f.get_tensor(key), value)


def test_stage_trains_with_bf16_autocast_and_gradient_checkpointing(world: Path) -> None:
    config = _config(iterations=1, eval_prompts=None, precision={"autocast": "bf16", "gradient_checkpointing": True})
    result = run_tiny_stage(config, world, "bf16", "bf16-lora")
    metrics = result.history[0]
    assert all(np.isfinite(v) for v in metrics.values())
    assert metrics["train/ratio_mean"] == pytest.approx(1.0, abs=1e-3)  # on-policy, one precision for both
    assert (world / "bf16-lora" / "pytorch_lora_weights.safetensors").is_file()


def test_a_bf16_lora_base_holds_the_transformer_in_bf16_and_trains_the_adapter_in_float32(world: Path) -> None:
    from vgrpo.parallel.distributed import Distributed
    from vgrpo.training.phases import setup_policy

    velocities, gradients = {}, {}
    for base in ("fp32", "bf16"):
        config = _config(iterations=1, eval_prompts=None, precision={"autocast": "bf16", "lora_base_dtype": base})
        stage = setup_policy(config, world / "base", None, Distributed())
        dtypes = {(p.requires_grad, p.dtype) for p in stage.pipe.transformer.parameters()}
        base_dtype = torch.bfloat16 if base == "bf16" else torch.float32
        assert dtypes == {(False, base_dtype), (True, torch.float32)}
        assert stage.pipe.text_encoder.dtype == torch.float32  # the frozen encoders keep precision.frozen_dtype
        cond = stage.adapter.encode_prompts(["a photo of a red square", "a photo of two circles"])
        latents = torch.randn(2, *stage.adapter.latent_shape, generator=torch.Generator().manual_seed(0))
        lora = [p for p in stage.policy.parameters() if p.requires_grad]
        with torch.no_grad():  # a LoRA B away from zero, the same in both runs
            for p in lora:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
        v = stage.policy(latents, torch.tensor([0.7, 0.3]), cond)
        velocities[base], gradients[base] = v.detach(), torch.autograd.grad(v.square().mean(), lora)
    # Under autocast the linear layers run the same bf16 matmuls whatever the base's dtype; the bf16-rounded
    # norm and embedding weights are the rest of the difference.
    assert velocities["bf16"].dtype == torch.float32
    torch.testing.assert_close(velocities["bf16"], velocities["fp32"], rtol=0.03, atol=0.03)
    flat = {base: torch.cat([g.flatten() for g in grads]) for base, grads in gradients.items()}
    assert torch.nn.functional.cosine_similarity(flat["bf16"], flat["fp32"], dim=0) > 0.99
    result = run_tiny_stage(
        _config(iterations=1, eval_prompts=None, precision={"autocast": "bf16", "lora_base_dtype": "bf16"}),
        world,
        "bf16-base",
        "bf16-base-lora",
    )
    assert all(np.isfinite(v) for v in result.history[0].values())
    assert result.history[0]["train/ratio_mean"] == pytest.approx(1.0, abs=1e-3)  # one precision for both passes
    assert "lora_base_dtype" not in _config().precision.model_dump()  # the default leaves fingerprints unchanged


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"precision": {"lora_base_dtype": "bf16"}}, "needs precision.autocast: bf16"),
        ({"precision": {"autocast": "bf16", "lora_base_dtype": "bf16"}, "lora": None}, "needs lora"),
        (
            {"precision": {"autocast": "bf16", "lora_base_dtype": "bf16", "merged_lora": True}},
            "cannot be combined with precision.merged_lora",
        ),
    ],
)
def test_a_bf16_lora_base_is_refused_where_it_cannot_work(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _config(**overrides)


def test_stage_evaluation_uses_hybrid_sampling_when_configured(world: Path) -> None:
    evaluation = {
        "group_size": 1,
        "num_steps": 2,
        "rewards": [{"name": "geneval"}],
        "p_mix": 0.5,
        "base_pipeline": "base",
    }
    result = run_tiny_stage(_config(iterations=1, evaluation=evaluation), world, "hybrid", "hybrid-lora")
    assert result.evaluations[-1]["sampling"]["p_mix"] == 0.5


@pytest.mark.parametrize("at_start", [True, False])
def test_periodic_evaluation_includes_the_start_unless_it_is_switched_off(world: Path, at_start: bool) -> None:
    config = _config(iterations=2, eval_every=1, eval_at_start=at_start)
    result = run_tiny_stage(config, world, f"start-{at_start}", f"start-{at_start}-lora")
    assert [e["iteration"] for e in result.evaluations] == ([0, 1, 2] if at_start else [1, 2])


@pytest.mark.parametrize("overlap", [False, True])
def test_stage_evaluation_scores_on_the_reward_thread_only_with_overlap(
    world: Path, overlap: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vgrpo.rewards.multi import MultiReward

    submitted: list[int] = []
    real_submit = MultiReward.submit

    def submit(self: MultiReward, images: np.ndarray, *args: object) -> object:
        submitted.append(len(images))
        return real_submit(self, images, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(MultiReward, "submit", submit)
    evaluation = {"group_size": 1, "num_steps": 2, "rewards": [{"name": "geneval"}], "overlap": overlap}
    result = run_tiny_stage(
        _config(iterations=1, evaluation=evaluation), world, f"overlap-{overlap}", f"overlap-{overlap}-lora"
    )
    assert result.evaluations  # the stage evaluated, on the reward thread exactly when evaluation.overlap says so
    assert (sum(submitted) > 0) == overlap


def test_a_full_fine_tune_continues_from_the_previous_stages_pipeline(world: Path) -> None:
    """A full fine-tune exports a whole pipeline; the next stage starts from it (given as its starting weights), not
    from the base: with the same seed and data it would otherwise export the previous stage's bytes again."""
    from diffusers import SD3Transformer2DModel

    cfg = _config(eval_prompts=None, iterations=1, lora=None, optim={"lr": 1e-4, "micro_batch_size": 8})
    run_tiny_stage(cfg, world, "ft1-work", "ft1")
    run_tiny_stage(cfg, world, "ft2-work", "ft2", init_lora=Path("ft1"))

    def weights(name: str) -> dict[str, torch.Tensor]:
        model = SD3Transformer2DModel.from_pretrained(world / name / "transformer")
        return {k: v.detach() for k, v in model.state_dict().items()}

    base, first, second = weights("base"), weights("ft1"), weights("ft2")
    step = max((first[k] - base[k]).abs().max().item() for k in base)
    assert step > 0
    moved = max((second[k] - first[k]).abs().max().item() for k in base)
    assert 0 < moved <= 2 * step  # one more step from the first stage's weights
