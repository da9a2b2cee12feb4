"""Writing a pipeline directory that a plain ``from_pretrained`` loads: SD3 without T5 gets a stand-in T5.

diffusers loads a pipeline whose ``model_index.json`` marks a component ``[null, null]`` only when that
component is one of the class's ``_optional_components``; ``StableDiffusion3Pipeline``'s are the image encoder
and feature extractor, not ``text_encoder_3``/``tokenizer_3``. So an SD3 directory saved without T5 (the embedded
default) raises ``ValueError`` in ``StableDiffusion3Pipeline.from_pretrained(path)`` unless the caller passes
``text_encoder_3=None, tokenizer_3=None`` -- which ``mlflow.pyfunc`` and most users do not.

:func:`save_pipeline` writes such a pipeline with a stand-in in those two slots that changes nothing:

* ``text_encoder_3``: a one-layer ``T5EncoderModel`` with every weight zero. T5's final RMS norm multiplies by
  its (zero) weight, so its output is exactly zero for any input: what diffusers itself substitutes when
  ``text_encoder_3`` is None (``torch.zeros(batch, max_sequence_length, joint_attention_dim)``).
* ``tokenizer_3``: a tokenizer that gives no tokens for any text and pads with token 0, so
  ``max_sequence_length=n`` gives ``n`` zero rows (diffusers' default 256 included) and ``max_sequence_length=0``
  none, as without T5.

Its ``config.json`` carries :data:`ABSENT_T5_KEY`; :func:`is_absent_t5` recognises it and the project's loader
(:func:`vgrpo.models.pipeline.load_sd3_pipeline`) loads such a directory with ``text_encoder_3=None``, so the
project's own sampling is unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from diffusers import StableDiffusion3Pipeline
from tokenizers import Regex, Tokenizer, models, normalizers
from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

from vgrpo.atomic import atomic_dir

__all__ = ["ABSENT_T5_KEY", "absent_t5", "is_absent_t5", "is_sd3", "save_pipeline", "write_pipeline"]

ABSENT_T5_KEY = "vgrpo_absent_t5"
"""Key of a stand-in T5's ``config.json`` (module docstring); its value says what the stand-in is."""

_ABSENT_T5_NOTE = "all-zero T5 encoder: outputs zeros, as diffusers does for text_encoder_3=None"


def absent_t5(joint_attention_dim: int) -> tuple[Any, Any]:
    """The stand-in ``(text_encoder_3, tokenizer_3)`` for an SD3 transformer with ``joint_attention_dim``."""
    config = T5Config(
        vocab_size=1,
        d_model=joint_attention_dim,
        d_kv=1,
        d_ff=1,
        num_layers=1,
        num_heads=1,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        pad_token_id=0,
        eos_token_id=0,
    )
    setattr(config, ABSENT_T5_KEY, _ABSENT_T5_NOTE)  # saved in config.json with the rest
    encoder = T5EncoderModel(config)
    with torch.no_grad():
        for p in encoder.parameters():
            p.zero_()
    # Every character is removed before tokenising, so every text is zero tokens; padding adds token 0.
    backend = Tokenizer(models.WordLevel({"<pad>": 0}, unk_token="<pad>"))
    backend.normalizer = normalizers.Replace(Regex(r"[\s\S]+"), "")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", model_max_length=512)
    return encoder, tokenizer


def is_sd3(pipe: Any) -> bool:
    """Whether ``pipe`` is a ``StableDiffusion3Pipeline`` (a function: an ``isinstance`` would narrow ``pipe`` to
    diffusers' lazily typed class, whose attributes type checkers do not see)."""
    return isinstance(pipe, StableDiffusion3Pipeline)


def is_absent_t5(component_dir: Path) -> bool:
    """Whether ``component_dir`` (a pipeline's ``text_encoder_3/``) holds :func:`absent_t5`'s stand-in."""
    config = component_dir / "config.json"
    return config.is_file() and ABSENT_T5_KEY in json.loads(config.read_text())


def write_pipeline(pipe: Any, directory: Path) -> None:
    """``pipe.save_pretrained(directory)`` (safetensors); an SD3 pipeline without T5 is written with
    :func:`absent_t5`'s stand-in, so ``StableDiffusion3Pipeline.from_pretrained(directory)`` (or
    ``DiffusionPipeline``'s) loads it without arguments. ``pipe`` itself is not changed."""
    if is_sd3(pipe) and pipe.text_encoder_3 is None:
        encoder, tokenizer = absent_t5(int(pipe.transformer.config.joint_attention_dim))
        pipe = StableDiffusion3Pipeline(**{**pipe.components, "text_encoder_3": encoder, "tokenizer_3": tokenizer})
    pipe.save_pretrained(directory, safe_serialization=True)


def save_pipeline(pipe: Any, out_dir: Path) -> None:
    """:func:`write_pipeline` to ``out_dir`` atomically (:func:`vgrpo.atomic.atomic_dir`)."""
    atomic_dir(out_dir, lambda tmp: write_pipeline(pipe, tmp))
