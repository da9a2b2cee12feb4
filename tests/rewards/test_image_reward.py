"""ImageReward on a tiny random checkpoint in the original (THUDM/ImageReward, BLIP) naming: converted to HF BLIP
modules and scored, against a hand-written forward of BLIP's timm ViT + med.py BERT + MLP head."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vgrpo.rewards.convert import convert_image_reward, image_reward_to_hf
from vgrpo.rewards.image_reward import IMAGE_REWARD_MEAN, IMAGE_REWARD_STD, ImageReward
from vgrpo.rewards.registry import build_reward

WORDS = ["a", "red", "blue", "circle", "square", "two", "of", "left", "the", "star"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
PROMPTS = ["a red circle", "two blue squares", "a star left of the circle", "zebra", "the the the the"]
D, LAYERS, HEADS = 32, 2, 4


def _original_state() -> dict[str, torch.Tensor]:
    """A random ImageReward state dict: ``blip.visual_encoder`` (timm ViT, patch 8, 32 px), ``blip.text_encoder``
    (BLIP's BERT with cross-attention), ``mlp.layers``, plus keys the reward ignores."""
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.2

    v, t = "blip.visual_encoder", "blip.text_encoder"
    sd = {
        f"{v}.patch_embed.proj.weight": r(D, 3, 8, 8),
        f"{v}.patch_embed.proj.bias": r(D),
        f"{v}.cls_token": r(1, 1, D),
        f"{v}.pos_embed": r(1, 17, D),
        f"{v}.norm.weight": 1 + r(D),
        f"{v}.norm.bias": r(D),
        f"{t}.embeddings.word_embeddings.weight": r(len(VOCAB) + 2, D),  # + [DEC], [ENC]
        f"{t}.embeddings.position_embeddings.weight": r(40, D),
        f"{t}.embeddings.LayerNorm.weight": 1 + r(D),
        f"{t}.embeddings.LayerNorm.bias": r(D),
        f"{t}.embeddings.position_ids": torch.arange(40)[None],
        "blip.vision_proj.weight": r(16, D),
        "blip.vision_proj.bias": r(16),
    }
    for i in range(LAYERS):
        b = f"{v}.blocks.{i}"
        sd |= {
            f"{b}.attn.qkv.weight": r(3 * D, D),
            f"{b}.attn.qkv.bias": r(3 * D),
            f"{b}.attn.proj.weight": r(D, D),
            f"{b}.attn.proj.bias": r(D),
            f"{b}.mlp.fc1.weight": r(4 * D, D),
            f"{b}.mlp.fc1.bias": r(4 * D),
            f"{b}.mlp.fc2.weight": r(D, 4 * D),
            f"{b}.mlp.fc2.bias": r(D),
        }
        for n in ("norm1", "norm2"):
            sd[f"{b}.{n}.weight"], sd[f"{b}.{n}.bias"] = 1 + r(D), r(D)
        b = f"{t}.encoder.layer.{i}"
        for att in ("attention", "crossattention"):
            for n in ("self.query", "self.key", "self.value", "output.dense"):
                sd[f"{b}.{att}.{n}.weight"], sd[f"{b}.{att}.{n}.bias"] = r(D, D), r(D)
            sd[f"{b}.{att}.output.LayerNorm.weight"], sd[f"{b}.{att}.output.LayerNorm.bias"] = 1 + r(D), r(D)
        sd |= {
            f"{b}.intermediate.dense.weight": r(48, D),
            f"{b}.intermediate.dense.bias": r(48),
            f"{b}.output.dense.weight": r(D, 48),
            f"{b}.output.dense.bias": r(D),
            f"{b}.output.LayerNorm.weight": 1 + r(D),
            f"{b}.output.LayerNorm.bias": r(D),
        }
    dims = [D, 16, 8, 8, 4, 1]
    for (k, a), out in zip(enumerate((0, 2, 4, 6, 7)), dims[1:], strict=True):
        sd[f"mlp.layers.{a}.weight"], sd[f"mlp.layers.{a}.bias"] = r(out, dims[k]), r(out)
    return sd


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Multi-head attention, (B, T, D) in and out, ``HEADS`` heads, additive ``bias`` (B, 1, 1, S)."""
    split = lambda x: x.unflatten(-1, (HEADS, -1)).transpose(1, 2)  # noqa: E731
    s = split(q) @ split(k).transpose(-1, -2) / (D // HEADS) ** 0.5
    return ((s if bias is None else s + bias).softmax(-1) @ split(v)).transpose(1, 2).flatten(2)


def _reference(sd: dict, pixels: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """ImageReward.score from the original layout: BLIP ViT (vit.py), med.py BERT with cross-attention, MLP, z-score."""
    p = lambda name: (sd[f"{name}.weight"], sd[f"{name}.bias"])  # noqa: E731
    v, t = "blip.visual_encoder", "blip.text_encoder"
    x = F.conv2d(pixels, *p(f"{v}.patch_embed.proj"), stride=8).flatten(2).transpose(1, 2)
    x = torch.cat([sd[f"{v}.cls_token"].expand(len(x), -1, -1), x], 1) + sd[f"{v}.pos_embed"]
    for i in range(LAYERS):
        b = f"{v}.blocks.{i}"
        h = F.layer_norm(x, (D,), *p(f"{b}.norm1"), eps=1e-6)
        x = x + F.linear(_attend(*F.linear(h, *p(f"{b}.attn.qkv")).chunk(3, -1)), *p(f"{b}.attn.proj"))
        h = F.layer_norm(x, (D,), *p(f"{b}.norm2"), eps=1e-6)
        x = x + F.linear(F.gelu(F.linear(h, *p(f"{b}.mlp.fc1"))), *p(f"{b}.mlp.fc2"))
    image = F.layer_norm(x, (D,), *p(f"{v}.norm"), eps=1e-6)  # (B, 17, D)
    h = (
        sd[f"{t}.embeddings.word_embeddings.weight"][ids]
        + sd[f"{t}.embeddings.position_embeddings.weight"][: ids.shape[1]]
    )
    h = F.layer_norm(h, (D,), *p(f"{t}.embeddings.LayerNorm"), eps=1e-12)
    bias = (1.0 - mask[:, None, None, :].float()) * -10000.0  # med.py's extended attention mask
    for i in range(LAYERS):
        b = f"{t}.encoder.layer.{i}"
        for att, kv, ab in (("attention", None, bias), ("crossattention", image, None)):
            src = h if kv is None else kv
            a = _attend(
                F.linear(h, *p(f"{b}.{att}.self.query")),
                F.linear(src, *p(f"{b}.{att}.self.key")),
                F.linear(src, *p(f"{b}.{att}.self.value")),
                ab,
            )
            h = F.layer_norm(
                F.linear(a, *p(f"{b}.{att}.output.dense")) + h, (D,), *p(f"{b}.{att}.output.LayerNorm"), eps=1e-12
            )
        inter = F.gelu(F.linear(h, *p(f"{b}.intermediate.dense")))
        h = F.layer_norm(F.linear(inter, *p(f"{b}.output.dense")) + h, (D,), *p(f"{b}.output.LayerNorm"), eps=1e-12)
    r = h[:, 0]
    for a in (0, 2, 4, 6, 7):
        r = F.linear(r, *p(f"mlp.layers.{a}"))
    return (r.squeeze(-1) - IMAGE_REWARD_MEAN) / IMAGE_REWARD_STD


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("imagereward")
    sd = _original_state()
    torch.save(sd, root / "ImageReward.pt")
    (root / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    out = convert_image_reward(
        root / "ImageReward.pt", root / "hf", vocab_file=root / "vocab.txt", vision_heads=HEADS, text_heads=HEADS
    )
    return out, sd


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return np.random.default_rng(1).integers(0, 256, (5, 36, 44, 3), dtype=np.uint8)


def test_image_reward_matches_original_forward(converted: tuple[Path, dict], images: np.ndarray) -> None:
    from transformers import BertTokenizer, CLIPImageProcessor

    path, sd = converted
    out = ImageReward(path, device="cpu")(images, PROMPTS)
    assert out.scores.shape == (5,) and set(out.sub_scores) == {"raw"}
    np.testing.assert_allclose(out.scores, (out.sub_scores["raw"] - IMAGE_REWARD_MEAN) / IMAGE_REWARD_STD)
    pixels = CLIPImageProcessor.from_pretrained(path)(images=list(images), return_tensors="pt")["pixel_values"]
    assert pixels.shape == (5, 3, 32, 32)
    tok = BertTokenizer.from_pretrained(path / "tokenizer")(
        PROMPTS, padding="max_length", truncation=True, max_length=35, return_tensors="pt"
    )
    assert (tok["input_ids"][:, 0] == VOCAB.index("[CLS]")).all()  # [CLS] kept, as ImageReward.score
    ref = _reference(sd, pixels, tok["input_ids"], tok["attention_mask"])
    np.testing.assert_allclose(out.scores, ref.numpy(), atol=1e-5)


def test_image_reward_batching_determinism_and_registry(converted: tuple[Path, dict], images: np.ndarray) -> None:
    path, _ = converted
    one = ImageReward(path, device="cpu", batch_size=1)(images, PROMPTS).scores
    reward = build_reward("imagereward", {"path": str(path), "device": "cpu", "batch_size": 4})
    assert isinstance(reward, ImageReward)
    four = reward(images, PROMPTS).scores
    np.testing.assert_allclose(one, four, atol=1e-5)
    np.testing.assert_array_equal(four, reward(images, PROMPTS).scores)


def test_image_reward_missing_files_are_named(converted: tuple[Path, dict], tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        ImageReward(tmp_path / "nowhere")
    path, _ = converted
    for bad, message in (({"batch_size": 0}, "batch_size"), ({"dtype": "int8"}, "dtype")):
        with pytest.raises(ValueError, match=message):
            ImageReward(path, **bad)
    partial = tmp_path / "partial"
    partial.mkdir()
    for f in path.iterdir():
        if f.name != "tokenizer":
            (partial / f.name).symlink_to(f)
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        ImageReward(partial)
    (partial / "head.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"head\.safetensors"):
        ImageReward(partial)


def test_converter_rejects_other_checkpoints_and_drops_unused_keys() -> None:
    with pytest.raises(ValueError, match="not an ImageReward checkpoint"):
        image_reward_to_hf({"visual.conv1.weight": torch.zeros(1)})
    vision_cfg, text_cfg, _, text, head = image_reward_to_hf(_original_state())
    assert (
        vision_cfg["image_size"] == 32 and vision_cfg["layer_norm_eps"] == 1e-6 and text_cfg["encoder_hidden_size"] == D
    )
    assert "embeddings.position_ids" not in text and set(head) == {
        f"layers.{i}.{p}" for i in (0, 2, 4, 6, 7) for p in ("weight", "bias")
    }
