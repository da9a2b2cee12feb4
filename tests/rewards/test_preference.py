"""CLIP-family rewards on tiny random CLIPs: formulas against the model's own sub-modules, batching, errors,
the registry, and the open_clip / aesthetic converters against a hand-written forward of the original layout."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vgrpo.models.config import EmbeddedModelConfig
from vgrpo.models.embedded import train_clip_tokenizer
from vgrpo.rewards.convert import convert_aesthetic, convert_open_clip, open_clip_to_hf
from vgrpo.rewards.preference import AestheticScore, CLIPScore, HPSv2, PickScore
from vgrpo.rewards.registry import build_reward

PROMPTS = ["a red circle", "two blue squares", "a green triangle left of a star", "the word yes", "a cat"]
MAX_POS = 16


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    corpus = [*PROMPTS, "a yellow square above a red circle", "three green stars"] * 3
    return train_clip_tokenizer(corpus, EmbeddedModelConfig(max_text_tokens=MAX_POS))


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Path:  # type: ignore[no-untyped-def]
    """A 'world CLIP'-format directory: CLIPModel.save_pretrained + tokenizer + CLIPImageProcessor for 32x32."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    torch.manual_seed(0)
    text = dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=len(tokenizer),
        max_position_embeddings=MAX_POS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    vision = dict(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8
    )
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=24)).eval()
    path = tmp_path_factory.mktemp("clip")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (5, 40, 48, 3), dtype=np.uint8)  # resized + cropped to 32


def _direct(path: Path, images: np.ndarray, prompts: list[str]) -> tuple[torch.Tensor, float]:
    """cos(c, v) and exp(logit_scale) straight from the saved model's own sub-modules."""
    from transformers import CLIPImageProcessor, CLIPModel, CLIPTokenizer

    model = CLIPModel.from_pretrained(path).eval()
    pixels = CLIPImageProcessor.from_pretrained(path)(images=list(images), return_tensors="pt")["pixel_values"]
    tok = CLIPTokenizer.from_pretrained(path)(
        prompts, padding=True, truncation=True, max_length=MAX_POS, return_tensors="pt"
    )
    with torch.no_grad():
        v = model.visual_projection(model.vision_model(pixel_values=pixels).pooler_output)
        c = model.text_projection(model.text_model(**tok).pooler_output)
    v, c = v / v.norm(dim=-1, keepdim=True), c / c.norm(dim=-1, keepdim=True)
    return (v * c).sum(-1), float(model.logit_scale.detach().exp())


def test_pickscore_equals_logit_scale_times_cosine(clip_dir: Path, images: np.ndarray) -> None:
    cos, scale = _direct(clip_dir, images, PROMPTS)
    out = PickScore(clip_dir, device="cpu")(images, PROMPTS)
    assert out.scores.shape == (5,) and out.scores.dtype == np.float64
    np.testing.assert_allclose(out.sub_scores["cosine"], cos.numpy(), atol=1e-5)
    np.testing.assert_allclose(out.scores, scale * cos.numpy(), atol=1e-4)


def test_clipscore_equals_hessel_formula(clip_dir: Path, images: np.ndarray) -> None:
    cos = _direct(clip_dir, images, PROMPTS)[0].numpy()
    out = CLIPScore(clip_dir, device="cpu")(images, PROMPTS)
    np.testing.assert_allclose(out.sub_scores["cosine"], cos, atol=1e-5)
    np.testing.assert_allclose(out.scores, 2.5 * np.maximum(cos, 0.0), atol=1e-5)
    flow = CLIPScore(clip_dir, device="cpu", weight=100 / 30, clamp=False)(images, PROMPTS)
    np.testing.assert_allclose(flow.scores, 100 / 30 * cos, atol=1e-5)


def test_scores_batch_size_independent_and_deterministic(clip_dir: Path, images: np.ndarray) -> None:
    one = PickScore(clip_dir, device="cpu", batch_size=1)
    four = PickScore(clip_dir, device="cpu", batch_size=4)
    a, b = one(images, PROMPTS).scores, four(images, PROMPTS).scores
    np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_array_equal(b, four(images, PROMPTS).scores)
    half = PickScore(clip_dir, device="cpu", dtype="bfloat16")(images, PROMPTS)
    np.testing.assert_allclose(half.sub_scores["cosine"], one(images, PROMPTS).sub_scores["cosine"], atol=0.05)


def test_long_prompt_is_truncated_to_the_text_positions(clip_dir: Path, images: np.ndarray) -> None:
    out = CLIPScore(clip_dir, device="cpu")(images[:2], ["a red circle " * 40, "x"])
    assert np.isfinite(out.scores).all()


def test_missing_directory_or_file_is_named(clip_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        PickScore(tmp_path / "nowhere")
    for name in ("preprocessor_config.json", "config.json"):
        partial = tmp_path / name
        partial.mkdir()
        for f in clip_dir.iterdir():
            if f.name != name:
                (partial / f.name).symlink_to(f)
        with pytest.raises(FileNotFoundError, match=name):
            CLIPScore(partial)
    with pytest.raises(ValueError, match="dtype"):
        PickScore(clip_dir, dtype="int8")
    with pytest.raises(ValueError, match="batch_size"):
        PickScore(clip_dir, batch_size=0)


def test_registry_builds_pickscore(clip_dir: Path, images: np.ndarray) -> None:
    reward = build_reward("pickscore", {"path": str(clip_dir), "device": "cpu", "dtype": "float32"})
    assert isinstance(reward, PickScore)
    assert reward(images, PROMPTS).scores.shape == (5,)


# --- open_clip -> CLIPModel (HPSv2.1) ------------------------------------------------------------------


def _open_clip_state(width: int = 32, text_width: int = 32, vocab: int = 64, ctx: int = MAX_POS) -> dict:
    """A random open_clip ViT CLIP state dict in the original naming (2 + 2 layers, patch 8, image 32)."""
    g = torch.Generator().manual_seed(1)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.2

    sd = {
        "visual.conv1.weight": r(width, 3, 8, 8),
        "visual.class_embedding": r(width),
        "visual.positional_embedding": r(17, width),
        "visual.proj": r(width, 24),
        "token_embedding.weight": r(vocab, text_width),
        "positional_embedding": r(ctx, text_width),
        "text_projection": r(text_width, 24),
        "logit_scale": torch.tensor(math.log(50.0)),
    }
    for ln in ("visual.ln_pre", "visual.ln_post", "ln_final"):
        d = width if ln.startswith("visual") else text_width
        sd[f"{ln}.weight"], sd[f"{ln}.bias"] = 1 + r(d), r(d)
    for prefix, d in (("visual.transformer", width), ("transformer", text_width)):
        for i in range(2):
            p = f"{prefix}.resblocks.{i}"
            sd |= {
                f"{p}.attn.in_proj_weight": r(3 * d, d),
                f"{p}.attn.in_proj_bias": r(3 * d),
                f"{p}.attn.out_proj.weight": r(d, d),
                f"{p}.attn.out_proj.bias": r(d),
                f"{p}.ln_1.weight": 1 + r(d),
                f"{p}.ln_1.bias": r(d),
                f"{p}.ln_2.weight": 1 + r(d),
                f"{p}.ln_2.bias": r(d),
                f"{p}.mlp.c_fc.weight": r(4 * d, d),
                f"{p}.mlp.c_fc.bias": r(4 * d),
                f"{p}.mlp.c_proj.weight": r(d, 4 * d),
                f"{p}.mlp.c_proj.bias": r(d),
            }
    return sd


def _open_clip_blocks(sd: dict, prefix: str, x: torch.Tensor, heads: int, mask: torch.Tensor | None) -> torch.Tensor:
    """open_clip's ResidualAttentionBlock stack (nn.MultiheadAttention, exact GELU), x (L, N, D)."""
    for i in range(2):
        p = f"{prefix}.resblocks.{i}"
        h = F.layer_norm(x, x.shape[-1:], sd[f"{p}.ln_1.weight"], sd[f"{p}.ln_1.bias"])
        a = F.multi_head_attention_forward(
            h,
            h,
            h,
            x.shape[-1],
            heads,
            sd[f"{p}.attn.in_proj_weight"],
            sd[f"{p}.attn.in_proj_bias"],
            None,
            None,
            False,
            0.0,
            sd[f"{p}.attn.out_proj.weight"],
            sd[f"{p}.attn.out_proj.bias"],
            training=False,
            need_weights=False,
            attn_mask=mask,
        )[0]
        x = x + a
        h = F.layer_norm(x, x.shape[-1:], sd[f"{p}.ln_2.weight"], sd[f"{p}.ln_2.bias"])
        x = x + F.linear(
            F.gelu(F.linear(h, sd[f"{p}.mlp.c_fc.weight"], sd[f"{p}.mlp.c_fc.bias"])),
            sd[f"{p}.mlp.c_proj.weight"],
            sd[f"{p}.mlp.c_proj.bias"],
        )
    return x


def _open_clip_encode(sd: dict, pixels: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """open_clip ``encode_image`` / ``encode_text`` of a ViT CLIP, written from the original layout."""
    x = F.conv2d(pixels, sd["visual.conv1.weight"], stride=8).flatten(2).transpose(1, 2)  # (N, 16, D)
    x = torch.cat([sd["visual.class_embedding"].expand(len(x), 1, -1), x], 1) + sd["visual.positional_embedding"]
    x = F.layer_norm(x, x.shape[-1:], sd["visual.ln_pre.weight"], sd["visual.ln_pre.bias"])
    x = _open_clip_blocks(sd, "visual.transformer", x.transpose(0, 1), 4, None).transpose(0, 1)
    img = (
        F.layer_norm(x[:, 0], x.shape[-1:], sd["visual.ln_post.weight"], sd["visual.ln_post.bias"]) @ sd["visual.proj"]
    )
    t = sd["token_embedding.weight"][ids] + sd["positional_embedding"][: ids.shape[1]]
    causal = torch.full((ids.shape[1], ids.shape[1]), float("-inf")).triu(1)
    t = _open_clip_blocks(sd, "transformer", t.transpose(0, 1), 4, causal).transpose(0, 1)
    t = F.layer_norm(t, t.shape[-1:], sd["ln_final.weight"], sd["ln_final.bias"])
    txt = t[torch.arange(len(ids)), ids.argmax(-1)] @ sd["text_projection"]  # pooled at EOT, the largest id
    return img, txt


def test_open_clip_conversion_matches_original_forward(tmp_path: Path) -> None:
    from transformers import CLIPConfig, CLIPModel

    sd = _open_clip_state()
    kwargs, hf = open_clip_to_hf(sd, vision_heads=4, text_heads=4)
    model = CLIPModel(CLIPConfig(**kwargs)).eval()
    model.load_state_dict(hf, strict=True)
    assert model.config.vision_config.image_size == 32 and model.config.text_config.hidden_act == "gelu"
    pixels = torch.randn(3, 3, 32, 32)
    ids = torch.tensor([[62, 5, 9, 63, 0, 0], [62, 7, 63, 0, 0, 0], [62, 1, 2, 3, 4, 63]])  # BOS .. EOT, 0-padded
    ref_img, ref_txt = _open_clip_encode(sd, pixels, ids)
    with torch.no_grad():
        img = model.visual_projection(model.vision_model(pixel_values=pixels).pooler_output)
        txt = model.text_projection(model.text_model(input_ids=ids).pooler_output)
    torch.testing.assert_close(img, ref_img, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(txt, ref_txt, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(model.logit_scale.exp(), torch.tensor(50.0))
    with pytest.raises(ValueError, match="outside the ViT CLIP layout"):  # layer scale: another architecture
        open_clip_to_hf({**sd, "visual.transformer.resblocks.0.ls_1.gamma": torch.ones(32)}, 4, 4)


def test_eos_mismatch_between_config_and_tokenizer_is_refused(clip_dir: Path, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong_eos"
    wrong.mkdir()
    for f in clip_dir.iterdir():
        if f.name != "config.json":
            (wrong / f.name).symlink_to(f)
    cfg = json.loads((clip_dir / "config.json").read_text())
    cfg["text_config"]["eos_token_id"] = 2  # legacy argmax pooling, but this BPE's EOS is not its largest id
    (wrong / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="eos_token_id=2"):
        PickScore(wrong, device="cpu")


def _open_clip_style_tokenizer(path: Path) -> Path:
    """A character-level CLIP BPE whose BOS / EOT are the last two ids, as in open_clip's vocabulary (EOT pooled
    by argmax), written as vocab.json + merges.txt (no merges)."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens = [*letters, *(f"{c}</w>" for c in letters), "<|startoftext|>", "<|endoftext|>"]
    path.mkdir()
    (path / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (path / "merges.txt").write_text("#version: 0.2\n")
    return path


def test_hpsv2_scores_cosine_of_the_converted_checkpoint(tmp_path: Path, images: np.ndarray) -> None:
    from transformers import CLIPImageProcessor

    tok_dir = _open_clip_style_tokenizer(tmp_path / "tok")
    sd = _open_clip_state(vocab=54)
    ckpt = tmp_path / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": {f"module.{k}": v for k, v in sd.items()}}, ckpt)  # the HPSv2 release layout
    out = convert_open_clip(ckpt, tmp_path / "hps", tokenizer_dir=tok_dir, vision_heads=4, text_heads=4)
    reward = build_reward("hpsv2", {"path": str(out), "device": "cpu", "batch_size": 2})
    assert isinstance(reward, HPSv2)
    pixels = CLIPImageProcessor.from_pretrained(out)(images=list(images), return_tensors="pt")["pixel_values"]
    ids = reward.tokenizer(PROMPTS, padding=True, truncation=True, max_length=MAX_POS, return_tensors="pt")["input_ids"]
    assert (ids[:, 0] == 52).all() and (ids.max(-1).values == 53).all()
    ref_img, ref_txt = _open_clip_encode(sd, pixels, ids)
    ref = (F.normalize(ref_img, dim=-1) * F.normalize(ref_txt, dim=-1)).sum(-1)  # hpsv2: diag(img @ txt.T)
    np.testing.assert_allclose(reward(images, PROMPTS).scores, ref.numpy(), atol=1e-5)


def test_aesthetic_converts_and_scores_mlp_of_normalised_embedding(
    clip_dir: Path, tmp_path: Path, images: np.ndarray
) -> None:
    from transformers import CLIPImageProcessor, CLIPModel

    g = torch.Generator().manual_seed(2)
    dims = [24, 16, 8, 8, 4, 1]
    sd = {}
    for (i, a), b in zip(enumerate((0, 2, 4, 6, 7)), dims[1:], strict=True):
        sd[f"layers.{a}.weight"], sd[f"layers.{a}.bias"] = (
            torch.randn(b, dims[i], generator=g),
            torch.randn(b, generator=g),
        )
    torch.save(sd, tmp_path / "sac+logos+ava1-l14-linearMSE.pth")
    with pytest.raises(ValueError, match="expected keys"):
        torch.save({"w": torch.zeros(1)}, tmp_path / "bad.pth")
        convert_aesthetic(tmp_path / "bad.pth", tmp_path / "bad.safetensors")
    mlp = convert_aesthetic(tmp_path / "sac+logos+ava1-l14-linearMSE.pth", tmp_path / "aesthetic_mlp.safetensors")
    with pytest.raises(FileNotFoundError, match="aesthetic MLP"):
        AestheticScore(clip_dir, device="cpu")
    out = build_reward("aesthetic", {"path": str(clip_dir), "mlp_file": str(mlp), "device": "cpu"})(images, PROMPTS)
    model = CLIPModel.from_pretrained(clip_dir).eval()
    pixels = CLIPImageProcessor.from_pretrained(clip_dir)(images=list(images), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        v = F.normalize(model.visual_projection(model.vision_model(pixel_values=pixels).pooler_output), dim=-1)
    for a in (0, 2, 4, 6, 7):
        v = F.linear(v, sd[f"layers.{a}.weight"], sd[f"layers.{a}.bias"])
    np.testing.assert_allclose(out.scores, v.squeeze(-1).numpy(), rtol=1e-5, atol=1e-5)
