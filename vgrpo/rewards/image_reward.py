"""ImageReward (Xu et al. 2023) on transformers' BLIP modules, loaded from a local converted directory.

THUDM/ImageReward, ``ImageReward/ImageReward.py`` (``ImageReward.score`` / ``inference_rank``): the prompt is
tokenised by BLIP's BERT tokenizer (``padding="max_length", truncation=True, max_length=35``, the ``[CLS]``
token left in place -- the released code does not substitute ``[ENC]``); the image goes through BLIP's ViT-L
(``visual_encoder``, all tokens after its final LayerNorm); the BERT text encoder runs bidirectionally with
cross-attention to those image tokens (``encoder_attention_mask`` all ones); its ``[CLS]`` feature goes
through the MLP head (``Linear(768,1024), Dropout, Linear(1024,128), Dropout, Linear(128,64), Dropout,
Linear(64,16), Linear(16,1)``, no activations), and the reward is ``(mlp - 0.16717362830052426) / 1.0333394966054072``.

Images: ``Resize(224, bicubic)``, ``CenterCrop(224)``, OpenAI CLIP mean/std, here the directory's
``CLIPImageProcessor`` (PIL backend) written by :func:`vgrpo.rewards.convert.convert_image_reward`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from vgrpo.rewards.base import Metadata, RewardOutput
from vgrpo.rewards.convert import IMAGE_REWARD_HEAD_FILE
from vgrpo.rewards.preference import (
    WEIGHTS,
    LocalModelReward,
    aesthetic_mlp,
    load_image_processor,
    require_files,
)

__all__ = ["IMAGE_REWARD_MEAN", "IMAGE_REWARD_STD", "ImageReward"]

IMAGE_REWARD_MEAN = 0.16717362830052426
"""Mean of the raw MLP output over ImageReward's training set (``ImageReward.mean``)."""
IMAGE_REWARD_STD = 1.0333394966054072
"""Its standard deviation (``ImageReward.std``)."""
MAX_LENGTH = 35
"""ImageReward's text length (``max_length=35`` in ``score`` and ``inference_rank``)."""


class ImageReward(LocalModelReward):
    """ImageReward-v1.0: ``(MLP(BERT_xattn(prompt, ViT(image))[CLS]) - mean) / std``; sub-score ``raw`` (MLP output).

    Args:
        path: a directory with ``vision/`` (``BlipVisionModel``), ``text/`` (``BlipTextModel`` with
            cross-attention), ``tokenizer/`` (BERT ``vocab.txt``), ``head.safetensors`` and
            ``preprocessor_config.json`` (see :func:`vgrpo.rewards.convert.convert_image_reward`).
        max_length: text tokens, 35 as ImageReward (capped at the text tower's positions).
        kwargs: ``device``, ``dtype`` (the towers'; the head and the normalisation run in float32) and
            ``batch_size``, as :class:`vgrpo.rewards.preference.LocalModelReward`.
    """

    name: ClassVar[str] = "imagereward"

    def __init__(self, path: str | Path, *, max_length: int = MAX_LENGTH, **kwargs: Any):
        from safetensors.torch import load_file
        from transformers import BertTokenizer, BlipTextModel, BlipVisionModel

        super().__init__(path, **kwargs)
        require_files(self.path, (IMAGE_REWARD_HEAD_FILE,), ("preprocessor_config.json",))
        for sub, files in (("vision", WEIGHTS), ("text", WEIGHTS), ("tokenizer", ("vocab.txt",))):
            require_files(self.path / sub, files, *([("config.json",)] if sub != "tokenizer" else []))
        vision: Any = BlipVisionModel.from_pretrained(str(self.path / "vision"), use_safetensors=True, dtype=self.dtype)
        text: Any = BlipTextModel.from_pretrained(
            str(self.path / "text"), use_safetensors=True, dtype=self.dtype, add_pooling_layer=False
        )
        if not text.config.is_decoder:
            raise ValueError(f"{self.path / 'text'}: config.is_decoder must be true (it builds the cross-attention)")
        self.vision = vision.to(self.device).eval().requires_grad_(False)
        self.text = text.to(self.device).eval().requires_grad_(False)
        self.mlp = aesthetic_mlp(load_file(str(self.path / IMAGE_REWARD_HEAD_FILE))).to(self.device)
        self.tokenizer = BertTokenizer.from_pretrained(str(self.path / "tokenizer"))
        self.processor = load_image_processor(self.path)
        self.max_length = min(int(max_length), int(text.config.max_position_embeddings))

    @torch.no_grad()
    def features(self, images: np.ndarray, prompts: Sequence[str]) -> torch.Tensor:
        """The text encoder's ``[CLS]`` feature ``(N, hidden)`` float32, cross-attending to each image's ViT tokens."""
        out = []
        for sl in self.batches(len(images)):
            pixels = self.processor(images=list(images[sl]), return_tensors="pt")["pixel_values"]
            image_embeds = self.vision(pixel_values=pixels.to(self.device, self.dtype)).last_hidden_state  # (B, L, Dv)
            image_atts = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=self.device)  # (B, L)
            tok = self.tokenizer(
                list(prompts[sl]),
                padding="max_length",
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
            hidden = self.text(
                input_ids=tok["input_ids"].to(self.device),
                attention_mask=tok["attention_mask"].to(self.device),
                encoder_hidden_states=image_embeds,
                encoder_attention_mask=image_atts,
                is_decoder=False,
            ).last_hidden_state  # (B, T, D)
            out.append(hidden[:, 0, :].float())
        return torch.cat(out)

    @torch.no_grad()
    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        raw = self.mlp(self.features(images, prompts)).squeeze(-1).double()  # (N,)
        scores = (raw - IMAGE_REWARD_MEAN) / IMAGE_REWARD_STD
        return RewardOutput(scores=scores.cpu().numpy(), sub_scores={"raw": raw.cpu().numpy()})
