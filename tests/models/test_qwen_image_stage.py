"""Qwen-Image in the pipeline, on a tiny QwenImagePipeline built offline: the family's stage contract
(tests/models/family_contract.py: a stage on a saved directory trains its LoRA, exported for a plain
QwenImagePipeline, or every weight, exported as a whole pipeline; a killed stage resumes to the weights of the
uninterrupted one, bit for bit)."""

from __future__ import annotations

import math

from tests.models.family_contract import FamilyStageContract
from vgrpo.models.tiny import tiny_qwen_image_pipeline


class TestQwenImageStage(FamilyStageContract):
    family = "qwen-image"
    evaluation_shift = math.exp(0.5 - 240 * 0.4 / 7936)  # calculate_shift(16 tokens; 256 / 8192, 0.5 / 0.9) as e^mu
    tiny_pipeline = staticmethod(lambda prompts: tiny_qwen_image_pipeline(seed=0))  # a byte-level tokenizer
