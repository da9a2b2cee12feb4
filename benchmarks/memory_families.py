"""Per-GPU memory estimate of a LoRA stage of the newer families, as their ``params/models/*.yaml`` ship it
(docs/real-models.md#memory-of-the-newer-families): Qwen-Image, FLUX.2-dev, Z-Image-Turbo and Wan2.1-T2V-14B, each
with the transformer's frozen base in fp32 (the default) and in bf16 (``precision.lora_base_dtype: bf16``).

    python -m benchmarks.memory_families            # markdown tables on stdout
    python -m benchmarks.memory_families --json out.json

Parameter counts come from the published configs (each model's ``transformer/config.json`` and its text encoder's
``config.json``, restated below), built on the ``meta`` device: nothing is downloaded or allocated. The text
encoders count their language model only (Qwen2.5-VL's and Mistral-3's vision towers, 0.4 to 0.7 B, are left
out). The LoRA rank, targets, resolution, micro-batch, gradient checkpointing and text-encoder placement are read
from the family's params file. Activations use :func:`benchmarks.memory_estimate.activations`' rough term (stated
as such there); the sequence holds the image tokens and, for the joint-attention families, the text tokens.
GB here is 10^9 bytes.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import yaml
from diffusers import (
    AutoencoderKL,
    AutoencoderKLFlux2,
    AutoencoderKLQwenImage,
    AutoencoderKLWan,
    Flux2Transformer2DModel,
    QwenImageTransformer2DModel,
    WanTransformer3DModel,
    ZImageTransformer2DModel,
)
from transformers import (
    MistralConfig,
    MistralModel,
    Qwen2Config,
    Qwen2Model,
    Qwen3Config,
    Qwen3Model,
    UMT5Config,
    UMT5EncoderModel,
)

from benchmarks.memory_estimate import GB, VAE_16, activations, elements, lora_elements, table
from vgrpo.models import registry
from vgrpo.models.config import LoraConfig

REPO = Path(__file__).resolve().parents[1]

# Qwen/Qwen-Image transformer/config.json.
QWEN_IMAGE = {
    "patch_size": 2,
    "in_channels": 64,
    "out_channels": 16,
    "num_layers": 60,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 3584,
    "guidance_embeds": False,
    "axes_dims_rope": (16, 56, 56),
}
# black-forest-labs/FLUX.2-dev transformer/config.json.
FLUX2_DEV = {
    "patch_size": 1,
    "in_channels": 128,
    "num_layers": 8,
    "num_single_layers": 48,
    "attention_head_dim": 128,
    "num_attention_heads": 48,
    "joint_attention_dim": 15360,
    "timestep_guidance_channels": 256,
    "mlp_ratio": 3.0,
    "axes_dims_rope": (32, 32, 32, 32),
    "guidance_embeds": True,
}
# Tongyi-MAI/Z-Image-Turbo transformer/config.json.
Z_IMAGE = {
    "all_patch_size": (2,),
    "all_f_patch_size": (1,),
    "in_channels": 16,
    "dim": 3840,
    "n_layers": 30,
    "n_refiner_layers": 2,
    "n_heads": 30,
    "n_kv_heads": 30,
    "cap_feat_dim": 2560,
    "axes_dims": [32, 48, 48],
    "axes_lens": [1024, 512, 512],
}
# Wan-AI/Wan2.1-T2V-14B-Diffusers transformer/config.json.
WAN_14B = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 40,
    "attention_head_dim": 128,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 4096,
    "freq_dim": 256,
    "ffn_dim": 13824,
    "num_layers": 40,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
}
# The text encoders' language models: Qwen2.5-VL-7B-Instruct's (Qwen-Image), Mistral-Small-3.1-24B's (FLUX.2-dev),
# Qwen3-4B (Z-Image), google/umt5-xxl's encoder (Wan2.1).
QWEN25_VL_7B_TEXT: dict[str, Any] = {
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
}
MISTRAL_SMALL_24B_TEXT: dict[str, Any] = {
    "hidden_size": 5120,
    "intermediate_size": 32768,
    "num_hidden_layers": 40,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 131072,
}
QWEN3_4B: dict[str, Any] = {
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
}
UMT5_XXL: dict[str, Any] = {
    "d_model": 4096,
    "d_ff": 10240,
    "d_kv": 64,
    "num_heads": 64,
    "num_layers": 24,
    "vocab_size": 256384,
    "feed_forward_proj": "gated-gelu",
}


@dataclass(frozen=True)
class Family:
    """One family's shapes: its params file, the transformer's width and blocks, and its sequence."""

    name: str
    params: str
    registry_name: str  # vgrpo.models.registry's name: the family's LoRA targets when the params file leaves them
    width: int
    blocks: int
    text_tokens: int  # in the transformer's sequence (0: cross-attention only)
    vae_factor: int
    patch: int
    latent_frames: int = 1


FAMILIES = (
    Family("Qwen-Image", "params/models/qwen-image.yaml", "qwen-image", 3072, 60, 128, 8, 2),
    Family("FLUX.2-dev", "params/models/flux2.yaml", "flux2", 6144, 56, 512, 16, 1),
    Family("Z-Image-Turbo", "params/models/z-image.yaml", "z-image", 3840, 32, 128, 8, 2),
    Family("Wan2.1-T2V-14B", "params/models/wan.yaml", "wan", 5120, 40, 0, 8, 2, latent_frames=2),
)


def count_parameters(root: Path = REPO) -> dict[str, dict[str, int]]:
    """Per family: the transformer's, its LoRA's (its params file's rank and targets), the text encoder's and the
    VAE's element counts."""
    with torch.device("meta"):
        # mypy cannot resolve diffusers' model classes' mixin bases, so it does not see them as the nn.Modules they are
        built: dict[str, tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]] = {
            "Qwen-Image": (
                cast(torch.nn.Module, QwenImageTransformer2DModel(**QWEN_IMAGE)),
                Qwen2Model(Qwen2Config(**QWEN25_VL_7B_TEXT)),
                cast(torch.nn.Module, AutoencoderKLQwenImage()),  # diffusers' defaults: Qwen-Image's vae/config.json
            ),
            "FLUX.2-dev": (
                cast(torch.nn.Module, Flux2Transformer2DModel(**FLUX2_DEV)),
                MistralModel(MistralConfig(**MISTRAL_SMALL_24B_TEXT)),
                cast(torch.nn.Module, AutoencoderKLFlux2()),  # diffusers' defaults: FLUX.2-dev's vae/config.json
            ),
            "Z-Image-Turbo": (
                cast(torch.nn.Module, ZImageTransformer2DModel(**Z_IMAGE)),
                Qwen3Model(Qwen3Config(**QWEN3_4B)),
                cast(torch.nn.Module, AutoencoderKL(**VAE_16)),  # FLUX.1's 16-channel VAE
            ),
            "Wan2.1-T2V-14B": (
                cast(torch.nn.Module, WanTransformer3DModel(**WAN_14B)),
                UMT5EncoderModel(UMT5Config(**UMT5_XXL)),
                cast(torch.nn.Module, AutoencoderKLWan()),  # diffusers' defaults: Wan2.1's vae/config.json
            ),
        }
    counts = {}
    for family in FAMILIES:
        transformer, encoder, vae = built[family.name]
        lora = LoraConfig(**yaml.safe_load((root / family.params).read_text())["lora"])
        targets = lora.targets(registry.family(family.registry_name).lora_targets)
        counts[family.name] = {
            "transformer": elements(transformer),
            "lora": lora_elements(transformer, lora.rank, targets),
            "text_encoder": elements(encoder),
            "vae": elements(vae),
        }
    return counts


def lora_rows(family: Family, c: dict[str, int], base: str, root: Path = REPO) -> list[tuple[str, float, str]]:
    """A LoRA stage of ``family`` on one GPU with its frozen base in ``base`` (fp32 or bf16): rows of
    ``(component, bytes, arithmetic)``."""
    params = yaml.safe_load((root / family.params).read_text())
    precision, rank = params.get("precision", {}), params["lora"]["rank"]
    side = params["rollout"]["resolution"] // family.vae_factor // family.patch
    tokens = family.latent_frames * side**2 + family.text_tokens
    samples, checkpointing = params["optim"]["micro_batch_size"], precision.get("gradient_checkpointing", False)
    on_device = precision.get("text_encoders", "device") == "device"
    width = 4 if base == "fp32" else 2
    n, lora, enc = c["transformer"], c["lora"], c["text_encoder"]
    per_sample = f"({family.blocks} x 2 T d + 34 T d)" if checkpointing else f"{family.blocks} x 34 T d"
    return [
        (f"transformer weights, {base}", width * n, f"{n / 1e9:.2f} B x {width} B"),
        (f"LoRA r {rank} weights + grads, fp32", 8 * lora, f"{lora / 1e6:.1f} M x (4 + 4) B"),
        ("AdamW moments, fp32", 8 * lora, f"{lora / 1e6:.1f} M x 2 x 4 B"),
        (
            "text encoder, bf16",
            2 * enc if on_device else 0.0,
            f"{enc / 1e9:.2f} B x 2 B"
            + ("" if on_device else f"; 0 after the prompts are encoded ({precision['text_encoders']})"),
        ),
        ("VAE, bf16", 2 * c["vae"], f"{c['vae'] / 1e6:.1f} M x 2 B"),
        (
            "activations (rough)" + (", checkpointing" if checkpointing else ""),
            activations(tokens, family.width, family.blocks, samples, checkpointing),
            f"{samples} samples x {per_sample} B, T = {tokens}, d = {family.width}",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the counts and rows here")
    args = parser.parse_args()
    counts = count_parameters()
    rows: dict[str, Any] = {}
    for family in FAMILIES:
        c = counts[family.name]
        print(f"\n{family.name}: " + ", ".join(f"{k} {v / 1e9:.3f} B" for k, v in c.items()))
        for base in ("fp32", "bf16"):
            rows[f"{family.name} {base}"] = lora_rows(family, c, base)
            total = sum(r[1] for r in rows[f"{family.name} {base}"]) / GB
            print(f"\nLoRA stage, base in {base}, per GPU ({total:.1f} GB):\n" + table(rows[f"{family.name} {base}"]))
    if args.json:
        Path(args.json).write_text(json.dumps({"counts": counts, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
