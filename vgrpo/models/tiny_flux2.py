"""A tiny randomly initialised ``Flux2Pipeline`` built from config (no hub), for tests of the FLUX.2 family
(:mod:`vgrpo.models.flux2`); the other families' tiny builders are in :mod:`vgrpo.models.tiny` (one module would pass
the project's 350-line limit).

What differs from FLUX.2-dev besides the sizes: the tokenizer. FLUX.2's is a ``PixtralProcessor`` (Mistral's
tokenizer with an image processor), which needs torchvision; this one is a plain byte-level tokenizer with the same
chat-template interface, the only part of the processor ``Flux2Pipeline`` uses for text (``apply_chat_template``
on its system + user messages, padded to ``max_sequence_length``).
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import AutoencoderKLFlux2, Flux2Pipeline, Flux2Transformer2DModel
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import Mistral3Config, Mistral3ForConditionalGeneration, PreTrainedTokenizerFast

from vgrpo.models.tiny import dynamic_shift_scheduler

__all__ = ["MISTRAL_CHAT_TEMPLATE", "TINY_FLUX2_TOKENS", "tiny_flux2_pipeline", "tiny_mistral_tokenizer"]

MISTRAL_CHAT_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}[SYSTEM_PROMPT]"
    "{%- for c in message['content'] %}{{- c['text'] }}{%- endfor %}[/SYSTEM_PROMPT]"
    "{%- elif message['role'] == 'user' %}[INST]"
    "{%- for c in message['content'] %}{%- if c['type'] == 'text' %}{{- c['text'] }}{%- endif %}{%- endfor %}[/INST]"
    "{%- endif %}{%- endfor %}"
)
"""Mistral Small 3's chat template cut to what ``Flux2Pipeline`` renders (a system message and a user message of
text parts, no generation prompt): ``<s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST]``."""
TINY_FLUX2_TOKENS = 256
"""Text tokens per prompt of the tiny pipeline (its tokenizer's ``model_max_length``, so the adapter's default): the
pipeline's 168-byte system message, the template's tokens and the prompt, one token per byte."""
_SPECIALS: tuple[str, ...] = ("<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]")
_SPECIALS += ("[IMG_END]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]")
_WIDTH, _LAYERS = 16, 30  # 30 layers: the pipeline stacks the hidden states after layers 10, 20 and 30


def tiny_mistral_tokenizer(model_max_length: int = TINY_FLUX2_TOKENS) -> Any:
    """A byte-level BPE tokenizer without merges (one token per UTF-8 byte, so any prompt tokenizes) with Mistral's
    special tokens (``<s>``, ``<pad>``, ``[INST]``, ``[SYSTEM_PROMPT]``, ...) and :data:`MISTRAL_CHAT_TEMPLATE`;
    no files."""
    vocab = {token: i for i, token in enumerate([*_SPECIALS, *sorted(pre_tokenizers.ByteLevel.alphabet())])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=model_max_length,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(_SPECIALS[4:])})
    tokenizer.chat_template = MISTRAL_CHAT_TEMPLATE
    return tokenizer


def tiny_flux2_pipeline(seed: int = 0) -> Any:
    """A randomly initialised ``Flux2Pipeline`` with FLUX.2-dev's structure: a 30-layer Mistral-3 text encoder of
    width 16 (with a one-layer Pixtral vision tower the text path never runs) and :func:`tiny_mistral_tokenizer`, an
    ``AutoencoderKLFlux2`` at 2x with 4 latent channels whose batch-norm statistics are set away from the identity
    (so the tests see the normalisation), a guidance-distilled ``Flux2Transformer2DModel`` with one double- and one
    single-stream block over the 16 patchified channels (``(16, 4, 4)`` latents, 16 image tokens at 16 px), and a
    dynamically shifted exponential scheduler (the pipeline passes it its own ``mu``). ``save_pretrained`` +
    ``Flux2Pipeline.from_pretrained`` round-trip it."""
    tokenizer = tiny_mistral_tokenizer()
    torch.manual_seed(seed + 2)
    text = {
        "model_type": "mistral",
        "vocab_size": len(tokenizer),
        "hidden_size": _WIDTH,
        "intermediate_size": 2 * _WIDTH,
        "num_hidden_layers": _LAYERS,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
        "max_position_embeddings": 2 * TINY_FLUX2_TOKENS,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "sliding_window": None,
    }
    vision = {"model_type": "pixtral", "hidden_size": _WIDTH, "intermediate_size": 2 * _WIDTH, "num_hidden_layers": 1}
    vision |= {"num_attention_heads": 2, "head_dim": 8, "image_size": 16, "patch_size": 2}
    config = Mistral3Config(
        text_config=text,
        vision_config=vision,
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=1,
    )
    text_encoder = Mistral3ForConditionalGeneration(config).eval()
    torch.manual_seed(seed + 1)
    vae: Any = AutoencoderKLFlux2(
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=16,
    )
    with torch.no_grad():  # running statistics of a trained VAE are not 0 / 1
        vae.bn.running_mean.copy_(torch.linspace(-0.3, 0.3, 16))
        vae.bn.running_var.copy_(torch.linspace(0.5, 2.0, 16))
    torch.manual_seed(seed)
    transformer = Flux2Transformer2DModel(
        patch_size=1,
        in_channels=16,  # 4 VAE channels x a 2 x 2 patch
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=3 * _WIDTH,  # three stacked hidden states
        timestep_guidance_channels=16,
        axes_dims_rope=(2, 2, 2, 2),  # sums to the head width, like FLUX.2's (32, 32, 32, 32) to 128
        guidance_embeds=True,
    )
    scheduler = dynamic_shift_scheduler()  # FLUX.2's parameters are FLUX.1's
    return Flux2Pipeline(
        scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer
    )
