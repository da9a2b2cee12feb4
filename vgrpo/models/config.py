"""Configs of the model: the LoRA adapter (``lora:``), the precision (``precision:``) and the architecture of the
embedded default pipeline (``pretrain.model:``, built by :mod:`vgrpo.models.embedded`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from vgrpo.config_base import MAX_LORA_RANK, FrozenConfig

__all__ = ["ATTENTION_BOTH_STREAMS", "EmbeddedModelConfig", "LoraConfig", "PrecisionConfig"]

ATTENTION_BOTH_STREAMS = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
"""The attention projections of both streams of a joint (double-stream) block: the LoRA targets of SD3, FLUX.1,
FLUX.1-Kontext and Qwen-Image, and ``lora.target_modules``' default."""


class LoraConfig(FrozenConfig):
    """A LoRA adapter on the transformer (:func:`vgrpo.models.lora.add_lora`).

    ``target_modules`` left at its default (:data:`ATTENTION_BOTH_STREAMS`, which a config that does not set it
    records, so its fingerprint is what it was before families had defaults of their own) means the family's own
    targets, :attr:`vgrpo.models.adapter.PipelineAdapter.lora_targets` (:meth:`targets`): the same list for SD3,
    FLUX.1, Kontext and Qwen-Image; Z-Image's and Wan's one-stream attention; FLUX.2's adds its single-stream blocks'
    fused projection. Any other list is trained as given.
    """

    rank: int = Field(32, ge=1, le=MAX_LORA_RANK)
    alpha: int = Field(64, ge=1, le=MAX_LORA_RANK)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: tuple[str, ...] = ATTENTION_BOTH_STREAMS

    def targets(self, family_targets: Sequence[str]) -> tuple[str, ...]:
        """The module names LoRA adapts on a pipeline of the family whose targets are ``family_targets``."""
        return tuple(family_targets) if self.target_modules == ATTENTION_BOTH_STREAMS else self.target_modules


class PrecisionConfig(FrozenConfig):
    """How the model computes; the surrogates, ratios and losses are always float32."""

    autocast: Literal["fp32", "bf16"] = Field(
        "fp32", description="bf16 autocast of the transformer in rollouts and training (GPU runs); fp32 = off."
    )
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward (memory for time).")
    compile: bool = Field(
        False,
        description="torch.compile the transformer in place (its forward; parameter names unchanged): a one-off "
        "compile per stage for faster forwards and backwards; needs a C++ compiler on the CPU.",
    )
    merged_lora: bool = Field(
        False,
        description="Run the no-grad forwards (sampling, the behaviour policy's surrogates, evaluation) with the "
        "LoRA merged into the base weights (vgrpo.models.merged_lora): fewer, larger matmuls; rounds differently "
        "from the factored LoRA (about 1e-7 relative in float32). LoRA stages only.",
    )
    frozen_dtype: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="Weights dtype of the frozen text encoders and VAE; auto = bf16 on a CUDA device, fp32 on CPU. "
        "The transformer keeps float32 weights (the trained ones, and LoRA's base).",
    )
    lora_base_dtype: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Weights dtype of the transformer's frozen base in a LoRA stage (the adapter stays fp32): bf16 "
        "halves the base's memory (Qwen-Image's 20 B, FLUX.2-dev's 32 B parameters) and, under autocast bf16, "
        "computes the same bf16 matmuls as an fp32 base (autocast casts the weights); needs autocast: bf16.",
    )
    text_encoders: Literal["device", "cpu", "drop_after_encoding"] = Field(
        "device",
        description="Where the text encoders live: on the training device, on the CPU (encoding runs there), or "
        "on the device until the stage's training and evaluation prompts are encoded once at setup, then "
        "deleted (LoRA stages only: a full fine-tune exports the whole pipeline).",
    )
    prompt_cache_mb: float = Field(
        4096.0,
        ge=0,
        description="CPU memory budget of the prompt-embedding cache (least recently used prompts are evicted and "
        "re-encoded when met again); 0 = no cache. With drop_after_encoding it must hold the whole prompt set.",
    )

    attention: Literal["auto", "flash", "math"] = Field(
        "auto",
        description="The kernel of scaled-dot-product attention in the transformer's forwards: auto = torch's "
        "dispatch (the fused flash kernel where it applies), math = the unfused matmul-softmax-matmul path (on the "
        "CPU under bf16 autocast, whose flash backward is slow, the faster one for training).",
    )
    gelu: Literal["tanh", "sigmoid"] = Field(
        "tanh",
        description="How the feed-forwards' tanh-approximate GELU is computed: tanh = torch's kernel, sigmoid = the "
        "same function as x sigmoid(2 z) (vgrpo.models.gelu), which compiles into one fused kernel 2.6x faster on "
        "the CPU; needs compile: true (eagerly it is slower).",
    )

    @model_validator(mode="after")
    def _check_gelu_compiled(self) -> PrecisionConfig:
        if self.gelu == "sigmoid" and not self.compile:
            raise ValueError("gelu: sigmoid needs compile: true (eagerly the sigmoid form is slower than tanh)")
        return self

    LATER_OPTIONS: ClassVar[Mapping[str, Any]] = {
        "compile": False,
        "merged_lora": False,
        "lora_base_dtype": "fp32",
        "attention": "auto",
        "gelu": "tanh",
    }


class EmbeddedModelConfig(FrozenConfig):
    """Architecture of the embedded default pipeline (:mod:`vgrpo.models.embedded`)."""

    resolution: int = Field(32, ge=8, description="Image side in pixels.")
    vocab_size: int = Field(1000, ge=300, description="BPE vocabulary cap (the world needs about 430).")
    max_text_tokens: int = Field(20, ge=4, description="CLIP context length (world prompts need <= 17).")
    text_hidden_size: int = Field(64, ge=8)
    text_layers: int = Field(2, ge=2, description="SD3 reads the penultimate layer, so at least 2.")
    text_heads: int = Field(4, ge=1)
    text_projection_dim: int = Field(32, ge=4)
    vae_channels: tuple[int, ...] = Field(
        (16, 32), min_length=1, description="Encoder widths; each block after the first halves the resolution."
    )
    vae_layers_per_block: int = Field(1, ge=1)
    vae_norm_groups: int = Field(8, ge=1)
    latent_channels: int = Field(4, ge=1)
    patch_size: int = Field(
        2, ge=1, description="Transformer patch on the 16 x 16 latents: 64 tokens of 2 x 2 x 4 = 16 values."
    )
    num_layers: int = Field(4, ge=1)
    attention_head_dim: int = Field(32, ge=4)
    num_attention_heads: int = Field(4, ge=1)
    scheduler_shift: float = Field(1.0, gt=0, description="Static shift of the sampling schedule.")

    @model_validator(mode="after")
    def _check_shapes(self) -> EmbeddedModelConfig:
        down = 2 ** (len(self.vae_channels) - 1)
        if self.resolution % (down * self.patch_size):
            raise ValueError(
                f"resolution={self.resolution} must be divisible by the VAE downsampling ({down}) x patch_size "
                f"({self.patch_size})"
            )
        if any(c % self.vae_norm_groups for c in self.vae_channels):
            raise ValueError(f"vae_norm_groups={self.vae_norm_groups} must divide every vae_channels entry")
        if self.text_hidden_size % self.text_heads:
            raise ValueError(f"text_heads={self.text_heads} must divide text_hidden_size={self.text_hidden_size}")
        return self
