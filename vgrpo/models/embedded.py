"""The embedded default: a complete SD3-family diffusers pipeline small enough to pretrain on a CPU.

Same classes as SD3.5 -- two CLIP text encoders with projection (SD3's CLIP-L and CLIP-G), CLIP
tokenizers, an ``AutoencoderKL``, an ``SD3Transformer2DModel`` and ``FlowMatchEulerDiscreteScheduler`` --
assembled into a ``StableDiffusion3Pipeline``, saved with ``save_pretrained`` and loaded by the same
:func:`vgrpo.models.pipeline.load_sd3_pipeline` as a real SD3.5-M directory. The T5 encoder is left out
(``text_encoder_3=None``, a configuration diffusers supports): T5 tokens would multiply the sequence
length, which is what drives cost on a CPU.

Everything here builds offline from :class:`~vgrpo.models.config.EmbeddedModelConfig`; training lives in
:mod:`vgrpo.world.pretrain`.
"""

from __future__ import annotations

import json
import string
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from itertools import pairwise
from pathlib import Path
from typing import Any, cast

import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
from tokenizers import Regex, normalizers, pre_tokenizers
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

from vgrpo.models.config import EmbeddedModelConfig

__all__ = [
    "BOS_TOKEN",
    "EOS_TOKEN",
    "build_pipeline",
    "build_text_encoder",
    "build_transformer",
    "build_vae",
    "learn_bpe",
    "train_clip_tokenizer",
]

BOS_TOKEN, EOS_TOKEN = "<|startoftext|>", "<|endoftext|>"
END_OF_WORD = "</w>"
"""CLIP's end-of-word suffix, on the last symbol of every word."""
CLIP_SPLIT_PATTERN = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
"""CLIP's pre-tokenisation: letters as words, digits one by one, punctuation runs apart."""


def train_clip_tokenizer(corpus: Iterable[str], config: EmbeddedModelConfig) -> Any:
    """Train a CLIP-style byte-level BPE on ``corpus`` and return it as a ``transformers.CLIPTokenizer``.

    CLIP's normaliser and a whitespace split before the byte-level step (without it the vocabulary is
    learned on space-prefixed words that ``CLIPTokenizer`` never produces), ``</w>`` word ends, and
    CLIP's special tokens; ``model_max_length`` is the pipeline's text length. The merges are learned by
    :func:`learn_bpe`, so the same corpus gives the same tokenizer in every process.
    """
    normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(CLIP_SPLIT_PATTERN), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    words: Counter[tuple[str, ...]] = Counter()
    # Every printable character as a word of its own, so that no ASCII prompt meets an unknown token
    # (the unknown token is EOS, and the pooled embedding is read at the first EOS).
    for text in [*corpus, *string.printable.split()[0]]:
        for piece, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)):
            words[(*piece[:-1], piece[-1] + END_OF_WORD)] += 1
    vocab, merges = learn_bpe(words, config.vocab_size, pre_tokenizers.ByteLevel.alphabet())
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
        (Path(tmp) / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
        return CLIPTokenizer.from_pretrained(tmp, model_max_length=config.max_text_tokens)


def learn_bpe(
    words: Mapping[tuple[str, ...], int], vocab_size: int, alphabet: Iterable[str]
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-pair encoding (Sennrich et al. 2016) learned on ``words`` (symbol tuples -> counts): the vocabulary
    (the special tokens, then every single symbol sorted, then each merge's result in merge order) and the merges.
    Each step merges the most frequent adjacent pair, ties going to the pair that sorts first, until the
    vocabulary has ``vocab_size`` entries or no pair is left. ``tokenizers``' trainer breaks ties in hash-map
    order, which differs between processes: the same corpus gave different tokenizers, and so different base
    models, in every run."""
    singles = sorted({*alphabet, *(s for word in words for s in word)})
    order = dict.fromkeys([BOS_TOKEN, EOS_TOKEN, *singles])
    merges: list[tuple[str, str]] = []
    current = dict(words)
    while len(order) < vocab_size:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in current.items():
            for pair in pairwise(word):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merges.append(best)
        order[best[0] + best[1]] = None
        current = {_merged(word, best): count for word, count in current.items()}
    return {token: i for i, token in enumerate(order)}, merges


def _merged(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    """``word`` with every non-overlapping occurrence of ``pair`` (left to right) joined into one symbol."""
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def build_text_encoder(
    config: EmbeddedModelConfig, tokenizer: Any, seed: int, *, with_projection: bool = True
) -> torch.nn.Module:
    """A ``CLIPTextModelWithProjection`` (SD3's CLIPs; ``with_projection=False``: a ``CLIPTextModel``, FLUX's)
    sized by ``config`` whose special ids match ``tokenizer`` (the pooled output is read at the first EOS, so
    the ids must agree)."""

    text_config = CLIPTextConfig(
        # the tokenizer's vocabulary and special ids
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # the encoder's size and text length
        hidden_size=config.text_hidden_size,
        intermediate_size=4 * config.text_hidden_size,
        hidden_act="gelu",
        num_hidden_layers=config.text_layers,
        num_attention_heads=config.text_heads,
        projection_dim=config.text_projection_dim,
        max_position_embeddings=config.max_text_tokens,
    )
    torch.manual_seed(seed)
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(text_config).eval()


def build_vae(config: EmbeddedModelConfig, seed: int) -> torch.nn.Module:
    """An ``AutoencoderKL`` downsampling by ``2 ** (len(vae_channels) - 1)``; ``scaling_factor`` and
    ``shift_factor`` start at (1, 0) and are set from latent statistics after training, as SD3's were."""

    n = len(config.vae_channels)
    torch.manual_seed(seed)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * n,
        up_block_types=("UpDecoderBlock2D",) * n,
        block_out_channels=tuple(config.vae_channels),
        layers_per_block=config.vae_layers_per_block,
        latent_channels=config.latent_channels,
        norm_num_groups=config.vae_norm_groups,
        sample_size=config.resolution,
        scaling_factor=1.0,
        shift_factor=0.0,
        use_quant_conv=False,
        use_post_quant_conv=False,
        mid_block_add_attention=False,
    )
    return cast(torch.nn.Module, vae)


def latent_size(config: EmbeddedModelConfig) -> int:
    return config.resolution // 2 ** (len(config.vae_channels) - 1)


def build_transformer(config: EmbeddedModelConfig, seed: int) -> torch.nn.Module:
    """An ``SD3Transformer2DModel`` over the VAE's latents; text width = the two CLIP widths concatenated,
    pooled width = the two projections concatenated (SD3's layout)."""

    size = latent_size(config)
    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(
        # the latent grid and its patches
        sample_size=size,
        in_channels=config.latent_channels,
        out_channels=config.latent_channels,
        patch_size=config.patch_size,
        pos_embed_max_size=size // config.patch_size,
        # depth and width
        num_layers=config.num_layers,
        num_attention_heads=config.num_attention_heads,
        attention_head_dim=config.attention_head_dim,
        caption_projection_dim=config.attention_head_dim * config.num_attention_heads,
        # the text conditioning's widths
        joint_attention_dim=2 * config.text_hidden_size,
        pooled_projection_dim=2 * config.text_projection_dim,
    )
    return cast(torch.nn.Module, transformer)


def build_pipeline(config: EmbeddedModelConfig, tokenizer: Any, seed: int = 0) -> Any:
    """A randomly initialised ``StableDiffusion3Pipeline`` (both CLIP slots share ``tokenizer``)."""

    return StableDiffusion3Pipeline(
        transformer=build_transformer(config, seed),
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=config.scheduler_shift),
        vae=build_vae(config, seed + 1),
        text_encoder=build_text_encoder(config, tokenizer, seed + 2),
        tokenizer=tokenizer,
        text_encoder_2=build_text_encoder(config, tokenizer, seed + 3),
        tokenizer_2=tokenizer,
        text_encoder_3=None,
        tokenizer_3=None,
    )
