"""Reward registry: short names (what ``params/`` files say) to classes, imported only when selected.

A reward's heavy dependencies (open_clip, mmdet, an HTTP client) are imported by its own module, so
selecting ``ocr`` never imports a CLIP model.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from vgrpo.rewards.base import Reward

__all__ = ["REWARDS", "build_reward", "get_reward_class"]

REWARDS: dict[str, str] = {
    "geneval": "vgrpo.rewards.geneval:GenEvalReward",
    "geneval_server": "vgrpo.rewards.geneval_server:GenEvalServerReward",
    "ocr": "vgrpo.rewards.ocr:OCRReward",
    "clipscore": "vgrpo.rewards.preference:CLIPScore",
    "pickscore": "vgrpo.rewards.preference:PickScore",
    "hpsv2": "vgrpo.rewards.preference:HPSv2",
    "aesthetic": "vgrpo.rewards.preference:AestheticScore",
    "imagereward": "vgrpo.rewards.image_reward:ImageReward",
    "unifiedreward": "vgrpo.rewards.vlm:UnifiedReward",
}


def get_reward_class(name: str) -> type[Reward]:
    """The class registered as ``name``; a ``KeyError`` listing the valid names otherwise."""
    if name not in REWARDS:
        raise KeyError(f"unknown reward {name!r}; valid names: {sorted(REWARDS)}")
    module, _, attr = REWARDS[name].partition(":")
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, Reward)):
        raise TypeError(f"{REWARDS[name]} is not a Reward subclass")
    return cls


def build_reward(name: str, options: Mapping[str, Any] | None = None) -> Reward:
    """An instance of reward ``name`` built with keyword ``options`` (from a params file)."""
    cls = get_reward_class(name)
    try:
        return cls(**dict(options or {}))
    except TypeError as exc:
        raise TypeError(f"reward {name!r}: bad options {sorted(options or {})}: {exc}") from exc
