"""Per-GPU memory estimate of the paper's two real-model recipes, with its arithmetic (docs/real-models.md):
SD3.5-Medium with LoRA r 32 on every GPU, and FLUX.1-dev fully fine-tuned with FSDP over 8 GPUs.

    python -m benchmarks.memory_estimate            # markdown tables on stdout
    python -m benchmarks.memory_estimate --json out.json

Parameter counts come from the models' published configs (the ``config.json`` of each component in
stabilityai/stable-diffusion-3.5-medium and black-forest-labs/FLUX.1-dev, restated below), built on the ``meta``
device: nothing is downloaded or allocated. Activations are a rough term, stated as such: ``34 T d`` bytes per
transformer block per sample in 16-bit (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", with the attention-score term left out because PyTorch's fused attention does not keep it),
and with gradient checkpointing the blocks' inputs (``2 T d`` bytes each) plus one block recomputed.
GB here is 10^9 bytes.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch
from diffusers import AutoencoderKL, FluxTransformer2DModel, SD3Transformer2DModel
from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

from benchmarks.sd35_arch import SD35M  # stabilityai/stable-diffusion-3.5-medium's transformer/config.json

GB = 1e9

# black-forest-labs/FLUX.1-dev transformer/config.json.
FLUX_DEV_TRANSFORMER = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": True,
    "axes_dims_rope": (16, 56, 56),
}
# google/t5-v1_1-xxl's encoder (text_encoder_3 of SD3.5, text_encoder_2 of FLUX.1).
T5_XXL: dict[str, Any] = {
    "d_model": 4096,
    "d_ff": 10240,
    "d_kv": 64,
    "num_heads": 64,
    "num_layers": 24,
    "vocab_size": 32128,
    "feed_forward_proj": "gated-gelu",
}
# CLIP ViT-L/14's and OpenCLIP ViT-bigG/14's text towers with their projections.
CLIP_L: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "projection_dim": 768,
    "vocab_size": 49408,
    "max_position_embeddings": 77,
}
CLIP_G: dict[str, Any] = {
    "hidden_size": 1280,
    "intermediate_size": 5120,
    "num_hidden_layers": 32,
    "num_attention_heads": 20,
    "projection_dim": 1280,
    "vocab_size": 49408,
    "max_position_embeddings": 77,
}
# The 16-channel VAE both pipelines share (vae/config.json).
VAE_16 = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 16,
    "block_out_channels": (128, 256, 512, 512),
    "layers_per_block": 2,
    "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
    "norm_num_groups": 32,
}
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")


def elements(module: torch.nn.Module) -> int:
    """Parameters and buffers of ``module``."""
    return sum(p.numel() for p in module.parameters()) + sum(b.numel() for b in module.buffers())


def lora_elements(module: torch.nn.Module, rank: int, targets: Sequence[str]) -> int:
    """Parameters of a rank-``rank`` LoRA on every linear layer of ``module`` whose name ends with a target."""
    return sum(
        rank * (m.in_features + m.out_features)
        for name, m in module.named_modules()
        if isinstance(m, torch.nn.Linear) and any(name.endswith(t) for t in targets)
    )


def count_parameters() -> dict[str, Any]:
    """Element counts (parameters and persistent buffers) of every component, built on the meta device, and the
    LoRA r 32 parameters of SD3.5-M's attention projections (``lora.target_modules``'s default)."""
    with torch.device("meta"):
        # mypy cannot resolve diffusers' model classes' mixin bases, so it does not see them as the nn.Modules they are
        sd35 = cast(torch.nn.Module, SD3Transformer2DModel(**SD35M))
        flux = cast(torch.nn.Module, FluxTransformer2DModel(**FLUX_DEV_TRANSFORMER))
        counts = {
            "sd35m_transformer": elements(sd35),
            "sd35m_pos_embed_buffer": sd35.get_buffer("pos_embed.pos_embed").numel(),
            "flux_dev_transformer": elements(flux),
            "flux_double_block": elements(flux.get_submodule("transformer_blocks.0")),
            "t5_xxl_encoder": elements(T5EncoderModel(T5Config(**T5_XXL))),
            "clip_l": elements(CLIPTextModelWithProjection(CLIPTextConfig(**CLIP_L))),
            "clip_g": elements(CLIPTextModelWithProjection(CLIPTextConfig(**CLIP_G))),
            "vae": elements(cast(torch.nn.Module, AutoencoderKL(**VAE_16))),
        }
    counts["sd35m_lora_r32"] = lora_elements(sd35, 32, LORA_TARGETS)
    return counts


def activations(tokens: int, width: int, blocks: int, samples: int, checkpointing: bool) -> float:
    """The rough activation term in bytes: one micro-batch graph of ``samples`` (module docstring)."""
    per_block = 34 * tokens * width
    if not checkpointing:
        return float(samples * blocks * per_block)
    return float(samples * (blocks * 2 * tokens * width + per_block))


def sd35_lora(c: dict[str, Any], micro_batch: int = 12, text_encoders: str = "device") -> list[tuple[str, float, str]]:
    """SD3.5-M, LoRA r 32, 512 px, one process per GPU (DDP holds a whole copy on each): rows of
    ``(component, bytes, arithmetic)``."""
    lora, enc = c["sd35m_lora_r32"], c["clip_l"] + c["clip_g"] + c["t5_xxl_encoder"]
    tokens, width = (512 // 8 // 2) ** 2 + 77 + 256, 1536
    on_device = text_encoders == "device"
    return [
        (
            "transformer weights, fp32",
            4 * c["sd35m_transformer"],
            f"{c['sd35m_transformer'] / 1e9:.3f} B x 4 B (incl. the {c['sd35m_pos_embed_buffer'] / 1e6:.0f} M "
            "position-embedding buffer)",
        ),
        ("LoRA r 32 weights + grads, fp32", 8 * lora, f"{lora / 1e6:.1f} M x (4 + 4) B"),
        ("AdamW moments, fp32", 8 * lora, f"{lora / 1e6:.1f} M x 2 x 4 B (adamw8bit: x 2 x 1 B)"),
        (
            "text encoders, bf16",
            2 * enc if on_device else 0.0,
            f"({c['clip_l'] / 1e6:.0f} + {c['clip_g'] / 1e6:.0f} + {c['t5_xxl_encoder'] / 1e6:.0f}) M x 2 B"
            + ("" if on_device else f"; 0 with text_encoders: {text_encoders}"),
        ),
        ("VAE, bf16", 2 * c["vae"], f"{c['vae'] / 1e6:.1f} M x 2 B"),
        (
            "prompt embeddings of one batch",
            6 * (333 * 4096 + 2048) * 2.0,
            "6 prompts (48 / 8 GPUs) x (333 x 4096 + 2048) x 2 B; the cache itself is in CPU memory",
        ),
        (
            "activations (rough), checkpointing",
            activations(tokens, width, 24, micro_batch, True),
            f"{micro_batch} samples x (24 x 2 T d + 34 T d) B, T = {tokens}, d = {width}",
        ),
    ]


def flux_full_fsdp(c: dict[str, Any], gpus: int = 8, micro_batch: int = 4) -> list[tuple[str, float, str]]:
    """FLUX.1-dev, full fine-tuning, 720 px, FSDP (parameters, gradients and AdamW sharded over ``gpus``), bf16
    compute: rows of ``(component, bytes, arithmetic)``."""
    n, block, enc = c["flux_dev_transformer"], c["flux_double_block"], c["clip_l"] + c["t5_xxl_encoder"]
    tokens, width = (720 // 8 // 2) ** 2 + 512, 3072
    return [
        ("weights, fp32, sharded", 4 * n / gpus, f"{n / 1e9:.2f} B x 4 B / {gpus}"),
        ("gradients, fp32, sharded", 4 * n / gpus, f"{n / 1e9:.2f} B x 4 B / {gpus}"),
        ("AdamW moments, fp32, sharded", 8 * n / gpus, f"{n / 1e9:.2f} B x 2 x 4 B / {gpus} (adamw8bit: x 2 x 1 B)"),
        (
            "gathered blocks (transient)",
            2 * 2 * block + 4 * block,
            f"2 double blocks of {block / 1e6:.0f} M in bf16 (one prefetched) + one block's fp32 gradient",
        ),
        (
            "text encoders, bf16",
            2 * enc,
            f"({c['t5_xxl_encoder'] / 1e6:.0f} + {c['clip_l'] / 1e6:.0f}) M x 2 B; 0 with text_encoders: cpu",
        ),
        ("VAE, bf16", 2 * c["vae"], f"{c['vae'] / 1e6:.1f} M x 2 B"),
        (
            "activations (rough), checkpointing",
            activations(tokens, width, 57, micro_batch, True),
            f"{micro_batch} samples x (57 x 2 T d + 34 T d) B, T = {tokens}, d = {width}",
        ),
    ]


def table(rows: list[tuple[str, float, str]]) -> str:
    lines = ["| component | GB per GPU | arithmetic |", "|---|---:|---|"]
    lines += [f"| {name} | {size / GB:.2f} | {how} |" for name, size, how in rows]
    lines.append(f"| **total** | **{sum(r[1] for r in rows) / GB:.1f}** | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the counts and rows here")
    args = parser.parse_args()
    counts = count_parameters()
    sd35, flux = sd35_lora(counts), flux_full_fsdp(counts)
    print("Element counts (M):", ", ".join(f"{k} {v / 1e6:.1f}" for k, v in counts.items()))
    print("\nSD3.5-M, LoRA r 32, 512 px, per GPU:\n" + table(sd35))
    print("\nFLUX.1-dev, full fine-tuning, FSDP over 8 GPUs, 720 px, per GPU:\n" + table(flux))
    if args.json:
        rows = {"sd35m_lora": sd35, "flux_dev_full_fsdp8": flux}
        Path(args.json).write_text(json.dumps({"counts": counts, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
