"""Converters from the original preference-model checkpoints to safetensors / transformers directories.

The rewards of :mod:`vgrpo.rewards.preference` and :mod:`vgrpo.rewards.image_reward` load only safetensors
or ``save_pretrained`` directories. The original checkpoints are pickles; they are read here with
``torch.load(weights_only=True)`` (PyTorch's restricted loader: tensors and plain containers only) and
written once in the formats the rewards read:

* open_clip ViT state dicts (HPSv2.1's ``HPS_v2.1_compressed.pt``) -> a ``CLIPModel`` directory. The key
  mapping follows transformers' ``convert_clip_original_pytorch_to_hf.py`` (``in_proj`` split into q/k/v,
  ``proj`` / ``text_projection`` transposed, ``ln_pre`` -> ``pre_layrnorm``); activation is exact GELU, as
  open_clip's ViT-H-14 (not OpenAI's quick_gelu).
* ImageReward's ``ImageReward.pt`` (THUDM/ImageReward, BLIP ViT-L + BERT with cross-attention + MLP) ->
  ``vision/`` (``BlipVisionModel``), ``text/`` (``BlipTextModel``), ``head.safetensors`` and
  ``preprocessor_config.json``; the vision key renames follow transformers' ``convert_blip_original_pytorch_to_hf.py``.
* The LAION aesthetic predictor ``.pth`` (``layers.{0,2,4,6,7}``) -> ``aesthetic_mlp.safetensors``.
"""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

__all__ = [
    "AESTHETIC_FILE",
    "IMAGE_REWARD_HEAD_FILE",
    "OPENAI_MEAN",
    "OPENAI_STD",
    "convert_aesthetic",
    "convert_image_reward",
    "convert_open_clip",
    "image_reward_to_hf",
    "load_original",
    "open_clip_to_hf",
]

StateDict = dict[str, torch.Tensor]
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
AESTHETIC_FILE = "aesthetic_mlp.safetensors"
IMAGE_REWARD_HEAD_FILE = "head.safetensors"
AESTHETIC_KEYS = tuple(f"layers.{i}.{p}" for i in (0, 2, 4, 6, 7) for p in ("weight", "bias"))
"""The LAION predictor's Linear layers; 1, 3, 5 are Dropout (no activations in between)."""
_OPEN_CLIP_HEAD_WIDTH = {1280: 80, 1664: 104}
"""open_clip's ``head_width`` for ViT-H (1280) and ViT-bigG (1664); other widths use 64 heads' width."""


def load_original(path: str | Path) -> StateDict:
    """A checkpoint's state dict, read with the restricted loader; unwraps ``state_dict`` / ``model`` and
    strips a DDP ``module.`` prefix.

    Raises:
        FileNotFoundError: when ``path`` is not a file.
        ValueError: when the file holds no tensor mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    obj = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{path}: expected a state dict of tensors, got {type(obj).__name__}")
    return {k.removeprefix("module."): v for k, v in obj.items()}


def _count_layers(sd: StateDict, prefix: str) -> int:
    found = {int(m.group(1)) for k in sd if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
    if not found:
        raise ValueError(f"no layers under {prefix!r} in the state dict")
    return max(found) + 1


def _clip_layer(sd: StateDict, src: str, dst: str) -> StateDict:
    """One open_clip ``ResidualAttentionBlock`` as a transformers ``CLIPEncoderLayer``."""
    q, k, v = sd[f"{src}.attn.in_proj_weight"].chunk(3, dim=0)
    qb, kb, vb = sd[f"{src}.attn.in_proj_bias"].chunk(3, dim=0)
    out = {
        f"{dst}.self_attn.q_proj.weight": q,
        f"{dst}.self_attn.q_proj.bias": qb,
        f"{dst}.self_attn.k_proj.weight": k,
        f"{dst}.self_attn.k_proj.bias": kb,
        f"{dst}.self_attn.v_proj.weight": v,
        f"{dst}.self_attn.v_proj.bias": vb,
    }
    pairs = {
        "attn.out_proj": "self_attn.out_proj",
        "ln_1": "layer_norm1",
        "ln_2": "layer_norm2",
        "mlp.c_fc": "mlp.fc1",
        "mlp.c_proj": "mlp.fc2",
    }
    for a, b in pairs.items():
        for p in ("weight", "bias"):
            out[f"{dst}.{b}.{p}"] = sd[f"{src}.{a}.{p}"]
    return out


class _Reads(dict[str, torch.Tensor]):
    """A state dict that records which keys were read."""

    def __init__(self, sd: StateDict):
        super().__init__(sd)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> torch.Tensor:
        self.read.add(key)
        return super().__getitem__(key)


def open_clip_to_hf(
    sd: StateDict, vision_heads: int | None = None, text_heads: int | None = None
) -> tuple[dict[str, Any], StateDict]:
    """An open_clip ViT CLIP state dict as (``CLIPConfig`` kwargs, ``CLIPModel`` state dict); sizes are read
    from the shapes, head counts from open_clip's head widths unless given.

    Raises:
        ValueError: on keys this layout does not have (layer scale, attention pooling, ...: another architecture).
    """
    sd = _Reads(sd)
    width, _, patch, _ = sd["visual.conv1.weight"].shape
    grid = math.isqrt(sd["visual.positional_embedding"].shape[0] - 1)
    vocab, text_width = sd["token_embedding.weight"].shape
    vl, tl = _count_layers(sd, "visual.transformer.resblocks."), _count_layers(sd, "transformer.resblocks.")
    config: dict[str, Any] = {
        "projection_dim": sd["visual.proj"].shape[1],
        "logit_scale_init_value": float(sd["logit_scale"]),
        "vision_config": {
            "hidden_size": width,
            "intermediate_size": sd["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
            "num_hidden_layers": vl,
            "num_attention_heads": vision_heads or width // _OPEN_CLIP_HEAD_WIDTH.get(width, 64),
            "image_size": grid * patch,
            "patch_size": patch,
            "hidden_act": "gelu",
            "layer_norm_eps": 1e-5,
        },
        "text_config": {
            "hidden_size": text_width,
            "intermediate_size": sd["transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
            "num_hidden_layers": tl,
            "num_attention_heads": text_heads or text_width // 64,
            "vocab_size": vocab,
            "max_position_embeddings": sd["positional_embedding"].shape[0],
            "hidden_act": "gelu",
            "layer_norm_eps": 1e-5,
            "bos_token_id": vocab - 2,
            "eos_token_id": vocab - 1,
            "pad_token_id": 0,
        },
    }
    out: StateDict = {
        "logit_scale": sd["logit_scale"].reshape(()),
        "visual_projection.weight": sd["visual.proj"].T.contiguous(),
        "text_projection.weight": sd["text_projection"].T.contiguous(),
        "vision_model.embeddings.class_embedding": sd["visual.class_embedding"],
        "vision_model.embeddings.patch_embedding.weight": sd["visual.conv1.weight"],
        "vision_model.embeddings.position_embedding.weight": sd["visual.positional_embedding"],
        "text_model.embeddings.token_embedding.weight": sd["token_embedding.weight"],
        "text_model.embeddings.position_embedding.weight": sd["positional_embedding"],
    }
    for a, b in (
        ("visual.ln_pre", "vision_model.pre_layrnorm"),
        ("visual.ln_post", "vision_model.post_layernorm"),
        ("ln_final", "text_model.final_layer_norm"),
    ):
        out[f"{b}.weight"], out[f"{b}.bias"] = sd[f"{a}.weight"], sd[f"{a}.bias"]
    for i in range(vl):
        out.update(_clip_layer(sd, f"visual.transformer.resblocks.{i}", f"vision_model.encoder.layers.{i}"))
    for i in range(tl):
        out.update(_clip_layer(sd, f"transformer.resblocks.{i}", f"text_model.encoder.layers.{i}"))
    unused = sorted(set(sd) - sd.read - {"attn_mask"})  # attn_mask: the causal mask buffer of older open_clip
    if unused:
        raise ValueError(f"open_clip keys outside the ViT CLIP layout: {unused[:8]}")
    return config, out


def _save_model(model: Any, state: StateDict, out_dir: Path) -> Any:
    """``model`` (a transformers model) with ``state`` loaded strictly, written to ``out_dir``; returned."""
    model.eval().load_state_dict(state, strict=True)
    model.save_pretrained(out_dir)
    return model


def _save_processor(out_dir: Path, image_size: int) -> None:
    """A CLIP-style eval transform: bicubic resize of the short side, centre crop, OpenAI mean/std."""
    from transformers import CLIPImageProcessor

    CLIPImageProcessor(
        size={"shortest_edge": image_size},
        crop_size={"height": image_size, "width": image_size},
        resample=3,
        image_mean=list(OPENAI_MEAN),
        image_std=list(OPENAI_STD),
    ).save_pretrained(out_dir)


def convert_open_clip(
    checkpoint: str | Path,
    out_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    vision_heads: int | None = None,
    text_heads: int | None = None,
) -> Path:
    """Write an open_clip ViT checkpoint (e.g. HPSv2.1) as a ``CLIPModel`` directory with its image processor.

    ``tokenizer_dir``: an HF CLIP tokenizer (vocab.json + merges.txt, e.g. from
    ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``; open_clip uses the same OpenAI BPE) copied beside the weights.
    """
    from transformers import CLIPConfig, CLIPModel, CLIPTokenizer

    kwargs, sd = open_clip_to_hf(load_original(checkpoint), vision_heads, text_heads)
    out = Path(out_dir)
    model = _save_model(CLIPModel(CLIPConfig(**kwargs)), sd, out)
    _save_processor(out, model.config.vision_config.image_size)
    if tokenizer_dir is not None:
        CLIPTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(out)
    return out


def image_reward_to_hf(
    sd: StateDict, vision_heads: int | None = None, text_heads: int | None = None
) -> tuple[dict[str, Any], dict[str, Any], StateDict, StateDict, StateDict]:
    """ImageReward's state dict as (``BlipVisionConfig`` kwargs, ``BlipTextConfig`` kwargs, vision, text and
    MLP-head state dicts). BLIP's ViT uses LayerNorm eps 1e-6 and BLIP's BERT (med.py) 1e-12."""
    vis = {k.removeprefix("blip.visual_encoder."): v for k, v in sd.items() if k.startswith("blip.visual_encoder.")}
    txt = {k.removeprefix("blip.text_encoder."): v for k, v in sd.items() if k.startswith("blip.text_encoder.")}
    head = {k.removeprefix("mlp."): v for k, v in sd.items() if k.startswith("mlp.layers.")}
    if not vis or not txt or set(head) != set(AESTHETIC_KEYS):
        raise ValueError(
            "not an ImageReward checkpoint: expected blip.visual_encoder.*, blip.text_encoder.*, mlp.layers.*"
        )
    width, _, patch, _ = vis["patch_embed.proj.weight"].shape
    grid = math.isqrt(vis["pos_embed"].shape[1] - 1)
    vision_cfg: dict[str, Any] = {
        "hidden_size": width,
        "intermediate_size": vis["blocks.0.mlp.fc1.weight"].shape[0],
        "num_hidden_layers": _count_layers(vis, "blocks."),
        "num_attention_heads": vision_heads or width // 64,
        "image_size": grid * patch,
        "patch_size": patch,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-6,
    }
    vocab, hidden = txt["embeddings.word_embeddings.weight"].shape
    text_cfg: dict[str, Any] = {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "encoder_hidden_size": width,
        "intermediate_size": txt["encoder.layer.0.intermediate.dense.weight"].shape[0],
        "num_hidden_layers": _count_layers(txt, "encoder.layer."),
        "num_attention_heads": text_heads or hidden // 64,
        "max_position_embeddings": txt["embeddings.position_embeddings.weight"].shape[0],
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-12,
        "is_decoder": True,  # is_decoder builds the cross-attention; the call is bidirectional
    }
    renames = [  # transformers' convert_blip_original_pytorch_to_hf.py rename_key, anchored
        (r"^blocks\.", "encoder.layers."),
        (r"\.attn\.proj\.", ".self_attn.projection."),
        (r"\.attn\.qkv\.", ".self_attn.qkv."),
        (r"\.norm1\.", ".layer_norm1."),
        (r"\.norm2\.", ".layer_norm2."),
        (r"^norm\.", "post_layernorm."),
        (r"^patch_embed\.proj\.", "embeddings.patch_embedding."),
        (r"^pos_embed$", "embeddings.position_embedding"),
        (r"^cls_token$", "embeddings.class_embedding"),
    ]
    vision: StateDict = {}
    for key, value in vis.items():
        for pattern, repl in renames:
            key = re.sub(pattern, repl, key)
        vision[key] = value
    text = {k: v for k, v in txt.items() if not k.endswith("position_ids") and not k.startswith("pooler.")}
    return vision_cfg, text_cfg, vision, text, head


def convert_image_reward(
    checkpoint: str | Path,
    out_dir: str | Path,
    vocab_file: str | Path | None = None,
    vision_heads: int | None = None,
    text_heads: int | None = None,
) -> Path:
    """Write ``ImageReward.pt`` as ``out_dir/{vision,text,tokenizer}/`` + ``head.safetensors`` + processor.

    ``vocab_file``: ``bert-base-uncased``'s ``vocab.txt`` (ImageReward's tokenizer: that vocabulary plus
    ``[DEC]`` and ``[ENC]``, ids 30522 and 30523, which the reward never feeds).
    """
    from transformers import BertTokenizer, BlipTextConfig, BlipTextModel, BlipVisionConfig, BlipVisionModel

    vision_cfg, text_cfg, vision_sd, text_sd, head = image_reward_to_hf(
        load_original(checkpoint), vision_heads, text_heads
    )
    out = Path(out_dir)
    vision = _save_model(BlipVisionModel(BlipVisionConfig(**vision_cfg)), vision_sd, out / "vision")
    _save_model(BlipTextModel(BlipTextConfig(**text_cfg), add_pooling_layer=False), text_sd, out / "text")
    save_file({k: v.contiguous() for k, v in head.items()}, str(out / IMAGE_REWARD_HEAD_FILE))
    _save_processor(out, vision.config.image_size)
    if vocab_file is not None:
        (out / "tokenizer").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(vocab_file, out / "tokenizer" / "vocab.txt")
        tok = BertTokenizer.from_pretrained(str(out / "tokenizer"))
        tok.add_special_tokens({"bos_token": "[DEC]", "additional_special_tokens": ["[ENC]"]})
        tok.save_pretrained(out / "tokenizer")
    return out


def convert_aesthetic(checkpoint: str | Path, out_file: str | Path) -> Path:
    """Write the LAION aesthetic predictor (``sac+logos+ava1-l14-linearMSE.pth``) as safetensors.

    Raises:
        ValueError: when the keys are not ``layers.{0,2,4,6,7}.{weight,bias}``.
    """
    sd = load_original(checkpoint)
    if set(sd) != set(AESTHETIC_KEYS):
        raise ValueError(f"{checkpoint}: expected keys {sorted(AESTHETIC_KEYS)}, got {sorted(sd)}")
    out = Path(out_file)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(out))
    return out
