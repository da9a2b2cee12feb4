"""Tiny randomly initialised models built from config (no hub): an SD3 transformer with its conditioning, and
complete ``FluxPipeline``, ``ZImagePipeline`` and ``QwenImagePipeline`` s.

For tests, the demo and benchmarks of the algorithms and adapters themselves; the embedded default model that
is actually pretrained lives elsewhere.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping
from typing import Any, cast

import torch
from diffusers import (
    AutoencoderKLQwenImage,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
    SD3Transformer2DModel,
    ZImagePipeline,
    ZImageTransformer2DModel,
)
from tokenizers import pre_tokenizers
from torch import nn
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2Tokenizer,  # transformers 5: tokenizers-backed byte-level BPE
    Qwen3Config,
    Qwen3Model,
    T5Config,
    T5EncoderModel,
    T5Tokenizer,  # transformers 5: the tokenizers-backed (fast) T5 tokenizer
)

from vgrpo.models.config import EmbeddedModelConfig
from vgrpo.models.embedded import build_text_encoder, build_vae, train_clip_tokenizer
from vgrpo.policy import Conditioning

__all__ = [
    "TINY_FLUX",
    "TINY_LATENT_SHAPE",
    "TINY_T5_SIZES",
    "dynamic_shift_scheduler",
    "tiny_conditioning",
    "tiny_flux_pipeline",
    "tiny_qwen_image_pipeline",
    "tiny_qwen_tokenizer",
    "tiny_sd3_transformer",
    "tiny_t5_tokenizer",
    "tiny_z_image_pipeline",
]

TINY_LATENT_SHAPE = (4, 8, 8)
_TEXT_LEN, _TEXT_DIM, _POOLED_DIM = 6, 16, 16


def tiny_sd3_transformer(seed: int = 0, *, num_layers: int = 2, hidden_heads: int = 2) -> nn.Module:
    """An ``SD3Transformer2DModel`` over ``(4, 8, 8)`` latents: patch 2 (16 tokens), width 16."""

    torch.manual_seed(seed)
    model = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=num_layers,
        attention_head_dim=8,
        num_attention_heads=hidden_heads,
        joint_attention_dim=_TEXT_DIM,
        caption_projection_dim=8 * hidden_heads,
        pooled_projection_dim=_POOLED_DIM,
        out_channels=4,
        pos_embed_max_size=8,
    )
    return cast(nn.Module, model)


def tiny_conditioning(num_prompts: int, seed: int = 1) -> Conditioning:
    """Random text conditioning with the tiny transformer's dimensions: ``(B, 6, 16)`` and ``(B, 16)``."""
    g = torch.Generator().manual_seed(seed)
    return Conditioning(
        prompt_embeds=torch.randn(num_prompts, _TEXT_LEN, _TEXT_DIM, generator=g),
        pooled_prompt_embeds=torch.randn(num_prompts, _POOLED_DIM, generator=g),
    )


TINY_FLUX = EmbeddedModelConfig(
    resolution=16,
    vocab_size=300,
    max_text_tokens=20,
    text_hidden_size=16,
    text_layers=2,
    text_heads=2,
    text_projection_dim=8,
    vae_channels=(8, 16),
    vae_norm_groups=4,
    latent_channels=4,
    num_layers=1,
    attention_head_dim=8,
    num_attention_heads=2,
)
"""Sizes of :func:`tiny_flux_pipeline`: 16 px images, a 2x VAE to ``(4, 8, 8)`` latents, 16 packed image tokens."""
_T5_WIDTH, _T5_TOKENS = 16, 16
_FLUX_VAE_SCALING, _FLUX_VAE_SHIFT = 0.3611, 0.1159  # FLUX.1's VAE normalisation
_DEFAULT_CORPUS = ("a photo of a red circle", "two blue squares", "a green triangle left of a yellow star")
TINY_T5_SIZES: Mapping[str, Any] = {
    "d_model": _T5_WIDTH,
    "d_kv": 8,
    "d_ff": 2 * _T5_WIDTH,
    "num_layers": 1,
    "num_heads": 2,
    "relative_attention_num_buckets": 8,
    "relative_attention_max_distance": 16,
}
"""Sizes of the tiny pipelines' one-layer T5 encoders (FLUX.1's T5 here, Wan's UMT5 in :mod:`vgrpo.models.tiny_wan`):
all but the vocabulary, which is their tokenizer's."""


def dynamic_shift_scheduler(*, shift: float = 3.0, max_shift: float = 1.15, max_image_seq_len: int = 4096) -> Any:
    """A flow-matching Euler scheduler whose shift grows with the image's tokens (the pipelines compute its ``mu``
    from ``base_*`` / ``max_*``), with FLUX.1's and FLUX.2's parameters by default; Qwen-Image's differ in the
    three arguments."""
    return FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000,
        shift=shift,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=max_shift,
        base_image_seq_len=256,
        max_image_seq_len=max_image_seq_len,
        time_shift_type="exponential",
    )


def tiny_t5_tokenizer(corpus: Iterable[str], model_max_length: int = _T5_TOKENS) -> Any:
    """A T5 tokenizer (SentencePiece-style unigram: T5's ``<pad>``/``</s>``/``<unk>`` ids 0/1/2, ``▁`` word
    starts, ``</s>`` appended) whose pieces are the corpus words plus every printable character, so any ASCII
    prompt tokenizes without ``<unk>``. Built with the ``tokenizers`` library through transformers' fast
    ``T5Tokenizer``; no files."""

    words = sorted({w for text in corpus for w in text.split()})
    chars = sorted(set(string.printable) - set(string.whitespace))
    # Unigram picks the most probable split: whole words before characters.
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    vocab += [(f"▁{w}", -1.0) for w in words] + [(c, -5.0) for c in chars]
    return T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=model_max_length)


def tiny_flux_pipeline(seed: int = 0, *, corpus: Iterable[str] = _DEFAULT_CORPUS) -> Any:
    """A randomly initialised ``FluxPipeline`` with FLUX.1-dev's structure (:data:`TINY_FLUX` sizes):
    guidance-embedding transformer, CLIP (pooled vector) + T5 (tokens) text encoders with tokenizers built from
    ``corpus``, a VAE with FLUX's shift and scaling factors, and the dynamically shifted flow-matching scheduler
    with FLUX.1's shift parameters. ``save_pretrained`` + ``FluxPipeline.from_pretrained`` round-trip it."""

    cfg, corpus = TINY_FLUX, list(corpus)
    clip_tokenizer = train_clip_tokenizer(corpus, cfg)
    t5_tokenizer = tiny_t5_tokenizer(corpus)
    vae: Any = build_vae(cfg, seed + 1)
    vae.register_to_config(scaling_factor=_FLUX_VAE_SCALING, shift_factor=_FLUX_VAE_SHIFT)
    torch.manual_seed(seed + 3)
    t5_config = T5Config(vocab_size=len(t5_tokenizer), **TINY_T5_SIZES, pad_token_id=0, eos_token_id=1)
    t5 = T5EncoderModel(t5_config).eval()
    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(
        patch_size=1,  # the pipeline packs 2 x 2 patches itself
        in_channels=4 * cfg.latent_channels,
        num_layers=cfg.num_layers,
        num_single_layers=cfg.num_layers,
        attention_head_dim=cfg.attention_head_dim,
        num_attention_heads=cfg.num_attention_heads,
        joint_attention_dim=_T5_WIDTH,
        pooled_projection_dim=cfg.text_hidden_size,
        guidance_embeds=True,
        axes_dims_rope=(2, 2, 4),  # sums to attention_head_dim, like FLUX.1's (16, 56, 56) to 128
    )
    return FluxPipeline(
        scheduler=dynamic_shift_scheduler(),
        vae=vae,
        text_encoder=build_text_encoder(cfg, clip_tokenizer, seed + 2, with_projection=False),
        tokenizer=clip_tokenizer,
        text_encoder_2=t5,
        tokenizer_2=t5_tokenizer,
        transformer=transformer,
    )


QWEN_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
"""Qwen3's chat template cut to what ``ZImagePipeline`` renders (plain user messages, a generation prompt, the
``enable_thinking`` switch): the same text for those."""
_QWEN_WIDTH, _QWEN_TOKENS = 16, 64


def tiny_qwen_tokenizer(model_max_length: int = _QWEN_TOKENS) -> Any:
    """A Qwen2 tokenizer (byte-level BPE, no merges: one token per UTF-8 byte, so any prompt tokenizes) with
    Qwen's ``<|endoftext|>``/``<|im_start|>``/``<|im_end|>`` special tokens and :data:`QWEN_CHAT_TEMPLATE`;
    no files."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {token: i for i, token in enumerate(specials + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], model_max_length=model_max_length)
    tokenizer.add_special_tokens({"additional_special_tokens": specials[1:]})
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    return tokenizer


def tiny_z_image_pipeline(seed: int = 0) -> Any:
    """A randomly initialised ``ZImagePipeline`` with Z-Image-Turbo's structure: a two-layer Qwen3 text encoder
    (the pipeline reads its penultimate hidden states) with :func:`tiny_qwen_tokenizer`, the FLUX VAE's
    normalisation on a 2x VAE to ``(4, 8, 8)`` latents at 16 px (:data:`TINY_FLUX`'s VAE), a one-layer
    ``ZImageTransformer2DModel`` (patch 2: 16 image tokens) and Z-Image-Turbo's scheduler (static shift 3).
    ``save_pretrained`` + ``ZImagePipeline.from_pretrained`` round-trip it."""

    cfg = TINY_FLUX
    tokenizer = tiny_qwen_tokenizer()
    vae: Any = build_vae(cfg, seed + 1)
    vae.register_to_config(scaling_factor=_FLUX_VAE_SCALING, shift_factor=_FLUX_VAE_SHIFT)
    torch.manual_seed(seed + 2)
    qwen = Qwen3Model(
        Qwen3Config(
            vocab_size=len(tokenizer),
            hidden_size=_QWEN_WIDTH,
            intermediate_size=2 * _QWEN_WIDTH,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            max_position_embeddings=2 * _QWEN_TOKENS,
            pad_token_id=0,
        )
    ).eval()
    torch.manual_seed(seed)
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=cfg.latent_channels,
        dim=32,
        n_layers=1,
        n_refiner_layers=1,
        n_heads=2,
        n_kv_heads=2,
        cap_feat_dim=_QWEN_WIDTH,
        axes_dims=[4, 6, 6],  # sums to the head width, like Z-Image's (32, 48, 48) to 128
        axes_lens=[256, 32, 32],
    )
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)
    return ZImagePipeline(scheduler=scheduler, vae=vae, text_encoder=qwen, tokenizer=tokenizer, transformer=transformer)


def tiny_qwen_image_pipeline(seed: int = 0) -> Any:
    """A randomly initialised ``QwenImagePipeline`` with Qwen-Image's structure: a two-layer Qwen2.5-VL text encoder
    (with a one-block vision tower the text path never runs) and :func:`tiny_qwen_tokenizer` (its byte-level tokens
    make the chat template's system prefix longer than the 34 tokens the pipeline drops, as Qwen's own are), a
    video VAE (one temporal stage, 2x spatially) with per-channel latent normalisation to ``(4, 8, 8)`` latents at
    16 px, a one-layer ``QwenImageTransformer2DModel`` over FLUX-packed 2 x 2 patches, and the dynamically shifted
    scheduler with Qwen-Image's shift parameters but no ``shift_terminal`` (:mod:`vgrpo.models.qwen_image`)."""

    tokenizer = tiny_qwen_tokenizer(model_max_length=1024)
    torch.manual_seed(seed + 2)
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": _QWEN_WIDTH,
        "intermediate_size": 2 * _QWEN_WIDTH,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 1024,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]},  # sums to half the head width, as Qwen's
    }
    vision = {
        "depth": 1,
        "hidden_size": _QWEN_WIDTH,
        "intermediate_size": 2 * _QWEN_WIDTH,
        "num_heads": 2,
        "out_hidden_size": _QWEN_WIDTH,
        "patch_size": 2,
        "spatial_merge_size": 1,
        "temporal_patch_size": 1,
        "fullatt_block_indexes": [0],
        "window_size": 4,
    }
    text_encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision)).eval()
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLQwenImage(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 2],
        num_res_blocks=1,
        temperal_downsample=[False],
        latents_mean=[0.1, -0.2, 0.3, 0.0],
        latents_std=[1.5, 2.0, 0.8, 1.1],
    )
    torch.manual_seed(seed)
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,  # 4 latent channels x a 2 x 2 patch
        out_channels=4,
        num_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=_QWEN_WIDTH,
        axes_dims_rope=(2, 2, 4),  # sums to the head width, like Qwen-Image's (16, 56, 56) to 128
    )
    scheduler = dynamic_shift_scheduler(shift=1.0, max_shift=0.9, max_image_seq_len=8192)
    return QwenImagePipeline(
        scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer
    )
