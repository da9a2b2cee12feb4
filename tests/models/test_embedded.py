"""The embedded default pipeline: tokenizer trained here, SD3-family components built offline, the pipeline
saved and reloaded bit-exactly by the loader that loads a real SD3.5 directory."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.models.pipeline_dirs import assert_loader_names_the_missing_piece
from vgrpo.models.config import EmbeddedModelConfig
from vgrpo.models.embedded import BOS_TOKEN, EOS_TOKEN, build_pipeline, learn_bpe, train_clip_tokenizer
from vgrpo.models.pipeline import PipelineError, load_sd3_pipeline
from vgrpo.models.sd3 import SD3Adapter
from vgrpo.models.tiny import TINY_FLUX
from vgrpo.world import make_splits

REPO = Path(__file__).resolve().parents[2]
# The tiny FLUX pipeline's sizes with the default vocabulary cap (the tokenizer tests learn from the whole world).
TINY = EmbeddedModelConfig(**TINY_FLUX.model_dump(exclude={"vocab_size"}))
TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr", "ocr", "preference")


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    train, test = make_splits(0, 400, 80, tags=TAGS)
    return [md["prompt"] for md, _ in train + test]


@pytest.fixture(scope="module")
def tokenizer(prompts: list[str]):
    return train_clip_tokenizer(prompts[:400], TINY)


@pytest.fixture(scope="module")
def saved_pipeline(tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pipe = build_pipeline(TINY, tokenizer, seed=0)
    path = tmp_path_factory.mktemp("pipe") / "pipeline"
    pipe.save_pretrained(path)
    return path


def test_tokenizer_reads_every_world_prompt_as_whole_words(tokenizer, prompts: list[str]) -> None:
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    assert tokenizer.bos_token == BOS_TOKEN and tokenizer.eos_token_id == eos
    for prompt in prompts:  # includes test prompts the tokenizer never saw
        ids = tokenizer(prompt).input_ids
        assert len(ids) <= TINY.max_text_tokens, prompt
        assert ids[0] == tokenizer.bos_token_id and ids[-1] == eos
        assert eos not in ids[1:-1], f"unknown token (mapped to EOS) in {prompt!r}"
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("a photo of two red triangles").input_ids)
    assert tokens[1:-1] == ["a</w>", "photo</w>", "of</w>", "two</w>", "red</w>", "triangles</w>"]
    # CLIP's pre-tokenisation: digits one by one, quotes apart from the word.
    quoted = tokenizer.convert_ids_to_tokens(tokenizer('a sign that says "42"').input_ids)
    assert quoted[-5:-1] == ['"</w>', "4</w>", "2</w>", '"</w>']


def test_bpe_merges_the_most_frequent_pair_and_breaks_ties_by_order() -> None:
    words = Counter({("l", "o", "w</w>"): 5, ("l", "o", "t</w>"): 2, ("b", "o", "w</w>"): 2})
    vocab, merges = learn_bpe(words, vocab_size=11, alphabet=["a"])
    # ("l", "o") 7 times; then ("lo", "w</w>") and ("o", "w</w>") 5 and 2; then ties at 2 go to the pair that
    # sorts first: ("b", "o") before ("lo", "t</w>").
    assert merges == [("l", "o"), ("lo", "w</w>"), ("b", "o")]
    assert list(vocab) == [BOS_TOKEN, EOS_TOKEN, "a", "b", "l", "o", "t</w>", "w</w>", "lo", "low</w>", "bo"]
    assert learn_bpe(words, vocab_size=9, alphabet=["a"])[1] == [("l", "o")]  # stops at the vocabulary's size


def test_the_same_corpus_gives_the_same_tokenizer_in_every_process(prompts: list[str]) -> None:
    """tokenizers' own trainer broke ties in hash-map order, so two processes trained two tokenizers."""
    code = (
        "import hashlib, json, sys; from tests.models.test_embedded import TINY; "
        "from vgrpo.models.embedded import train_clip_tokenizer; "
        "tok = train_clip_tokenizer(json.loads(sys.stdin.read()), TINY); "
        "print(hashlib.sha256(json.dumps(tok.get_vocab(), sort_keys=True).encode()).hexdigest())"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps(prompts[:400]),
            capture_output=True,
            text=True,
            cwd=REPO,
            check=True,
        ).stdout
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and len(runs[0].strip()) == 64


def test_tokenizer_round_trips_through_save_pretrained(tokenizer, prompts: list[str], tmp_path: Path) -> None:
    from transformers import CLIPTokenizer

    tokenizer.save_pretrained(tmp_path)
    again = CLIPTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert again.model_max_length == TINY.max_text_tokens
    for prompt in prompts[:50]:
        assert again(prompt).input_ids == tokenizer(prompt).input_ids


def test_components_have_the_sd3_layout(tokenizer) -> None:
    from diffusers import AutoencoderKL, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection

    pipe = build_pipeline(TINY, tokenizer, seed=0)
    assert isinstance(pipe, StableDiffusion3Pipeline)
    assert isinstance(pipe.transformer, SD3Transformer2DModel) and isinstance(pipe.vae, AutoencoderKL)
    assert isinstance(pipe.text_encoder_2, CLIPTextModelWithProjection) and pipe.text_encoder_3 is None
    assert pipe.vae_scale_factor == 2
    # SD3 concatenates the two CLIP widths for the text stream and the two projections for the pooled vector.
    assert pipe.transformer.config.joint_attention_dim == 2 * TINY.text_hidden_size
    assert pipe.transformer.config.pooled_projection_dim == 2 * TINY.text_projection_dim
    assert pipe.text_encoder.config.eos_token_id == tokenizer.eos_token_id


def test_pipeline_reloads_bit_exactly_and_generates_the_same_images(tokenizer, saved_pipeline: Path) -> None:
    original = build_pipeline(TINY, tokenizer, seed=0)
    loaded = load_sd3_pipeline(saved_pipeline)
    for name in ("transformer", "vae", "text_encoder", "text_encoder_2"):
        a, b = getattr(original, name).state_dict(), getattr(loaded, name).state_dict()
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), f"{name}.{key}"
    kwargs = dict(num_inference_steps=3, height=16, width=16, guidance_scale=1.0, max_sequence_length=0)
    outs = []
    for pipe in (original, loaded):
        pipe.set_progress_bar_config(disable=True)
        g = torch.Generator().manual_seed(0)
        outs.append(pipe(["a photo of a red circle"] * 2, generator=g, output_type="np", **kwargs).images)
    assert outs[0].shape == (2, 16, 16, 3)
    np.testing.assert_array_equal(outs[0], outs[1])


def test_adapter_caches_prompts_and_matches_encode_prompt(saved_pipeline: Path) -> None:
    pipe = load_sd3_pipeline(saved_pipeline)
    adapter = SD3Adapter(pipe)
    assert adapter.max_sequence_length == 0 and adapter.latent_shape == (4, 8, 8) and adapter.resolution == 16
    assert adapter.scheduler_shift == TINY.scheduler_shift and adapter.image_seq_len == 16
    assert SD3Adapter(pipe, resolution=8).latent_shape == (4, 4, 4)  # rollout.resolution, SD3 side
    with pytest.raises(ValueError, match="not a positive multiple of 4"):
        SD3Adapter(pipe, resolution=10)
    cond = adapter.encode_prompts(["a photo of a square", "a photo of a circle", "a photo of a square"])
    assert cond.prompt_embeds.shape == (3, TINY.max_text_tokens, 2 * TINY.text_hidden_size)
    assert cond.pooled_prompt_embeds is not None and cond.pooled_prompt_embeds.shape == (3, 16)
    assert torch.equal(cond.prompt_embeds[0], cond.prompt_embeds[2])
    direct, _, pooled, _ = pipe.encode_prompt(
        "a photo of a circle", None, None, do_classifier_free_guidance=False, max_sequence_length=0
    )
    torch.testing.assert_close(cond.prompt_embeds[1], direct[0], rtol=0, atol=1e-6)  # batched vs single
    torch.testing.assert_close(cond.pooled_prompt_embeds[1], pooled[0], rtol=0, atol=1e-6)
    images = torch.rand(2, 3, 16, 16) * 2 - 1
    latents = adapter.encode_images(images, generator=torch.Generator().manual_seed(0))
    assert latents.shape == (2, 4, 8, 8)
    assert adapter.decode(latents).shape == (2, 3, 16, 16)


def test_loader_names_the_missing_piece(saved_pipeline: Path, tmp_path: Path) -> None:
    broken = assert_loader_names_the_missing_piece(load_sd3_pipeline, saved_pipeline, tmp_path, "vae")
    index = json.loads((broken / "model_index.json").read_text())
    index["_class_name"] = "FluxPipeline"
    (broken / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(PipelineError, match="expected StableDiffusion3Pipeline"):
        load_sd3_pipeline(broken)
