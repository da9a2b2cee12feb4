"""Rewards: scores of generated images against their prompts."""

from vgrpo.rewards.ocr import RapidOCRReader, levenshtein, ocr_score, ocr_target

__all__ = ["RapidOCRReader", "levenshtein", "ocr_score", "ocr_target"]
