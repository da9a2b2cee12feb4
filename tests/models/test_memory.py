"""Memory discipline for real models (vgrpo/models/prompt_cache.py, adapter.py, pipeline.py, precision.py): a bounded
prompt-embedding cache in CPU memory that returns what uncached encoding returns, frozen components in their own
dtype, text encoders on the CPU or dropped after the stage's prompts are encoded. The CUDA halves are ``gpu``-marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.tiny_world import write_tiny_world
from vgrpo.config import StageConfig
from vgrpo.errors import ConfigError
from vgrpo.models.config import PrecisionConfig
from vgrpo.models.pipeline import build_adapter, load_pipeline, place_pipeline
from vgrpo.models.precision import frozen_dtype
from vgrpo.models.prompt_cache import PromptEmbeddingCache, entry_bytes
from vgrpo.training.stage import run_stage

PROMPTS = [f"a photo of {n} {c} circles" for n in ("two", "three", "four") for c in ("red", "blue", "green")]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_world(tmp_path_factory.mktemp("world"))


def _load_on(path: Path, device: str, precision: PrecisionConfig) -> Any:
    """As a stage loads its pipeline (``vgrpo.training.phases``): frozen parts in ``precision.frozen_dtype``, then
    placed."""
    pipe = load_pipeline(path, frozen_dtype=frozen_dtype(precision.frozen_dtype, device))
    return place_pipeline(pipe, device, text_encoders=precision.text_encoders)


def _entry(fill: float, tokens: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((tokens, 8), fill), torch.full((3,), fill)


def test_cache_never_exceeds_its_budget_and_evicts_the_least_recently_used() -> None:
    size = entry_bytes(_entry(0.0))
    cache = PromptEmbeddingCache(3 * size + size // 2)  # room for three entries, not four
    for i in range(3):
        cache.put(f"p{i}", _entry(float(i)))
    assert cache.get("p0") is not None  # p0 is now the most recently used: p1 goes first
    cache.put("p3", _entry(3.0))
    assert "p1" not in cache and {"p0", "p2", "p3"} <= {p for p in ("p0", "p1", "p2", "p3") if p in cache}
    for i in range(4, 40):
        cache.put(f"p{i}", _entry(float(i)))
        assert cache.nbytes <= cache.max_bytes and len(cache) <= 3
    assert cache.evictions == 37 and cache.nbytes == 3 * size
    big = cache.put("big", _entry(1.0, tokens=100))  # larger than the whole budget: returned, not kept
    assert "big" not in cache and big[0].shape == (100, 8) and len(cache) == 3
    assert len(PromptEmbeddingCache(0).put("x", _entry(1.0))) == 2 and cache.get("nowhere") is None
    view = torch.zeros(10, 4, 8)[0]  # a row of a larger tensor: kept in storage of its own size
    stored = cache.put("view", (view, torch.zeros(3)))[0]
    assert stored.untyped_storage().nbytes() == entry_bytes([stored]) == 4 * 8 * 4


def test_adapter_cache_is_bounded_holds_cpu_tensors_and_matches_uncached_encoding(world: Path) -> None:
    pipe = load_pipeline(world / "base")
    uncached, _ = build_adapter(pipe, precision=PrecisionConfig(prompt_cache_mb=0))
    reference = {p: uncached.encode_prompts([p]) for p in PROMPTS}
    assert len(uncached.prompt_cache) == 0
    one = entry_bytes([reference[PROMPTS[0]].prompt_embeds[0], reference[PROMPTS[0]].pooled_prompt_embeds[0]])
    budget = 3 * one + one // 2  # three prompts fit; each batch below asks for more distinct ones
    adapter, _ = build_adapter(pipe, precision=PrecisionConfig(prompt_cache_mb=budget / 2**20))
    for batch in (PROMPTS[:5], PROMPTS[3:], PROMPTS[::-1], [PROMPTS[0], PROMPTS[0], PROMPTS[8]], PROMPTS):
        cond = adapter.encode_prompts(batch)
        assert adapter.prompt_cache.nbytes <= budget and len(adapter.prompt_cache) <= 3
        assert cond.pooled_prompt_embeds is not None
        for row, prompt in enumerate(batch):  # bit-identical to encoding the prompt alone, without a cache
            assert torch.equal(cond.prompt_embeds[row], reference[prompt].prompt_embeds[0])
            assert torch.equal(cond.pooled_prompt_embeds[row], reference[prompt].pooled_prompt_embeds[0])
    assert adapter.prompt_cache.evictions > 0 and adapter.prompt_cache.hits > 0
    kept = [adapter.prompt_cache.get(p) or () for p in PROMPTS if p in adapter.prompt_cache]
    assert kept and all(t.device.type == "cpu" for entry in kept for t in entry)


def test_frozen_components_load_in_their_own_dtype_and_the_transformer_stays_float32(world: Path) -> None:
    assert frozen_dtype("auto", "cuda") == torch.bfloat16 and frozen_dtype("auto", "cpu") == torch.float32
    assert frozen_dtype("fp16", "cpu") == torch.float16
    pipe = _load_on(world / "base", "cpu", PrecisionConfig())  # auto on the CPU: float32, as before
    assert {m.dtype for m in (pipe.text_encoder, pipe.text_encoder_2, pipe.vae, pipe.transformer)} == {torch.float32}
    pipe = _load_on(world / "base", "cpu", PrecisionConfig(frozen_dtype="bf16"))
    assert pipe.text_encoder.dtype == pipe.text_encoder_2.dtype == pipe.vae.dtype == torch.bfloat16
    assert pipe.transformer.dtype == torch.float32
    adapter, policy = build_adapter(pipe)
    cond = adapter.encode_prompts(PROMPTS[:2])
    assert cond.prompt_embeds.dtype == torch.bfloat16
    noise = torch.randn(2, *adapter.latent_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        v = policy(noise, torch.full((2,), 0.5), cond)
        images = adapter.decode(noise)
    assert v.dtype == images.dtype == torch.float32 and bool(torch.isfinite(images).all())


def test_text_encoders_can_stay_on_the_cpu_while_the_rest_moves(world: Path) -> None:
    pipe = place_pipeline(load_pipeline(world / "base"), "meta", text_encoders="cpu")
    assert pipe.text_encoder.device.type == pipe.text_encoder_2.device.type == "cpu"
    assert pipe.transformer.device.type == pipe.vae.device.type == "meta"
    pipe = place_pipeline(load_pipeline(world / "base"), "meta", text_encoders="drop_after_encoding")
    assert pipe.text_encoder.device.type == "meta"  # dropped later, encoded on the device first


def test_drop_after_encoding_serves_the_encoded_set_and_names_a_prompt_outside_it(world: Path) -> None:
    pipe = load_pipeline(world / "base")
    keep, _ = build_adapter(pipe)
    keep.encode_ahead(PROMPTS)  # text_encoders: device -> nothing is encoded ahead or dropped
    assert len(keep.prompt_cache) == 0 and pipe.text_encoder is not None
    expected = keep.encode_prompts(PROMPTS)
    small, _ = build_adapter(pipe, precision=PrecisionConfig(text_encoders="drop_after_encoding", prompt_cache_mb=1e-3))
    with pytest.raises(ConfigError, match=r"holds \d+ of the stage's 10 prompts"):
        small.encode_ahead(PROMPTS)
    assert pipe.text_encoder is not None  # nothing dropped when the set does not fit
    dropper, _ = build_adapter(pipe, precision=PrecisionConfig(text_encoders="drop_after_encoding"))
    dropper.encode_ahead(PROMPTS)
    assert pipe.text_encoder is None and pipe.text_encoder_2 is None and dropper.text_encoder_names == []
    cond = dropper.encode_prompts([*PROMPTS[::-1], ""])
    assert torch.equal(cond.prompt_embeds[: len(PROMPTS)], expected.prompt_embeds.flip(0))
    with pytest.raises(RuntimeError, match="'a photo of a square' was not among the prompts encoded at setup"):
        dropper.encode_prompts(["a photo of a square"])


def _stage(**overrides: Any) -> StageConfig:
    return StageConfig.model_validate(
        {
            "name": "memory",
            "prompts": "train.jsonl",
            "eval_prompts": "test.jsonl",
            "iterations": 2,
            "checkpoint_every": 2,
            "rollout": {
                "prompts_per_iteration": 2,
                "group_size": 2,
                "num_steps": 2,
                "shift": None,
                "micro_batch_size": 4,
            },
            "optim": {"lr": 1e-2, "micro_batch_size": 4},
            "algorithm": {"name": "vgrpo", "n_mc": 2},
            "lora": {"rank": 2, "alpha": 4, "target_modules": ["to_q", "to_k", "to_v"]},
            "rewards": [{"name": "geneval"}],
            "eval_every": 0,
            "evaluation": {"group_size": 1, "num_steps": 2, "rewards": [{"name": "geneval"}]},
            **overrides,
        }
    )


def test_a_stage_that_drops_its_text_encoders_trains_the_same_adapter(world: Path) -> None:
    from safetensors.torch import load_file

    weights = {}
    for mode in ("device", "drop_after_encoding"):
        result = run_stage(
            _stage(precision={"text_encoders": mode}),
            pipeline_dir=Path("base"),
            work_dir=world / mode,
            out_dir=world / f"lora-{mode}",
            root=world,
        )
        weights[mode] = load_file(next(result.out_dir.glob("*.safetensors")))
    assert weights["device"].keys() == weights["drop_after_encoding"].keys()
    assert all(torch.equal(weights["device"][k], weights["drop_after_encoding"][k]) for k in weights["device"])
    with pytest.raises(ValueError, match="drop_after_encoding needs lora"):
        _stage(lora=None, precision={"text_encoders": "drop_after_encoding"})


@pytest.mark.gpu
def test_on_cuda_frozen_components_are_bf16_and_the_cache_stays_on_the_cpu(world: Path) -> None:
    pipe = _load_on(world / "base", "cuda", PrecisionConfig())
    assert pipe.text_encoder.dtype == pipe.vae.dtype == torch.bfloat16 and pipe.transformer.dtype == torch.float32
    adapter, policy = build_adapter(pipe)
    cond = adapter.encode_prompts(PROMPTS)
    assert cond.prompt_embeds.device.type == "cuda" and adapter.text_encoder_device.type == "cuda"
    assert all(t.device.type == "cpu" for p in PROMPTS for t in adapter.prompt_cache.get(p) or ())
    noise = torch.randn(len(PROMPTS), *adapter.latent_shape, device="cuda")
    with torch.no_grad():
        assert bool(torch.isfinite(policy(noise, torch.full((len(PROMPTS),), 0.5, device="cuda"), cond)).all())
    on_cpu = _load_on(world / "base", "cuda", PrecisionConfig(text_encoders="cpu"))
    adapter, _ = build_adapter(on_cpu)
    assert adapter.text_encoder_device.type == "cpu" and adapter.device.type == "cuda"
    assert adapter.encode_prompts(PROMPTS[:2]).prompt_embeds.device.type == "cuda"


@pytest.mark.gpu
def test_a_stage_drops_its_text_encoders_on_cuda(world: Path) -> None:
    result = run_stage(
        _stage(precision={"text_encoders": "drop_after_encoding"}),
        pipeline_dir=Path("base"),
        work_dir=world / "cuda",
        out_dir=world / "lora-cuda",
        root=world,
    )
    assert len(result.history) == 2 and all(torch.isfinite(torch.tensor(h["train/grad_norm"])) for h in result.history)
