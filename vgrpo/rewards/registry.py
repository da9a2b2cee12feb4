"""Reward registry: short names (what ``params/`` files say) to classes, imported only when selected; and a
user's own reward, without forking: a ``module:Class`` path to a :class:`Reward` subclass, a ``module:function``
path to a plain function, or a name another package registers under the ``vgrpo.rewards`` entry-point group.
:func:`reward_class` is the class that answers for a name before anything is built (the class methods of
:class:`Reward`: prompt checks, headline columns, evaluation summaries); a function's is :class:`FunctionReward`.

A reward's heavy dependencies (open_clip, mmdet, an HTTP client) are imported by its own module, so
selecting ``ocr`` never imports a CLIP model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, cast

import numpy as np

from vgrpo.rewards.base import HeadlineColumn, Metadata, Reward, RewardOutput, plain_scores

__all__ = [
    "ENTRY_POINT_GROUP",
    "REWARDS",
    "FunctionReward",
    "build_reward",
    "get_reward_class",
    "resolve_reward",
    "reward_class",
    "reward_key",
]

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


ENTRY_POINT_GROUP = "vgrpo.rewards"
"""Packages register rewards under this entry-point group: ``[project.entry-points."vgrpo.rewards"]
mine = "my_package.rewards:MyReward"``; params files then say ``name: mine``."""


class FunctionReward(Reward):
    """A plain function as a reward (as trl's ``reward_funcs``): ``fn(images, prompts, metadata, **options)``
    takes ``uint8 (N, H, W, 3)`` images, ``N`` prompts and ``N`` metadata rows (or ``None``) and returns ``N``
    scores (or a :class:`RewardOutput`); anything else fails as :class:`vgrpo.rewards.base.RewardFailed`, naming what
    it returned."""

    def __init__(self, fn: Callable[..., Any], name: str, options: Mapping[str, Any] | None = None):
        self.fn, self.options = fn, dict(options or {})
        setattr(self, "name", name)  # noqa: B010 -- per instance: Reward declares the registry name a ClassVar

    @classmethod
    def headline_columns(cls, key: str, options: Mapping[str, Any]) -> tuple[HeadlineColumn, ...]:
        """The mean ``eval/KEY``, named ``key`` (by default the function's name)."""
        return (HeadlineColumn(key, f"eval/{key}"),)

    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        out = self.fn(images, list(prompts), metadata, **self.options)
        return out if isinstance(out, RewardOutput) else plain_scores(out)  # Reward.__call__ checks it


def reward_key(name: str, key: str | None = None) -> str:
    """A reward's name in logs and tables: ``key``, else the registry or entry-point name, else the attribute of a
    ``module:attribute`` path (``my_package.rewards:Brightness`` -> ``Brightness``)."""
    return key or name.rpartition(":")[2]


def _first_line(exc: BaseException) -> str:
    """``Type: message`` of an exception, its message cut to the first line; a SyntaxError's file and line."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"SyntaxError: {exc.msg} ({exc.filename}, line {exc.lineno})"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _import_target(name: str) -> Any:
    """What a reward name points at: the registry's class, an entry point's object, or ``module:attribute``."""
    if name in REWARDS:
        module, _, attr = REWARDS[name].partition(":")
        return getattr(importlib.import_module(module), attr)
    found = entry_points(group=ENTRY_POINT_GROUP, name=name)
    if found:
        entry = next(iter(found))
        try:
            return entry.load()
        except Exception as exc:
            raise KeyError(f"reward {name!r}: cannot load entry point {entry.value!r}: {_first_line(exc)}") from exc
    if ":" not in name:
        plugins = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
        raise KeyError(
            f"unknown reward {name!r}; valid names: {sorted(REWARDS)}, entry points {plugins}, or 'module:Class' "
            "(a Reward subclass) / 'module:function' (scores from images, prompts, metadata)"
        )
    module, _, attr = name.partition(":")
    try:
        target: Any = importlib.import_module(module)
    except Exception as exc:  # the module's own code ran: any error (SyntaxError, NameError, ...) is the user's
        raise KeyError(f"reward {name!r}: cannot import module {module!r}: {_first_line(exc)}") from exc
    for part in attr.split("."):
        if not hasattr(target, part):
            raise KeyError(f"reward {name!r}: module {module!r} has no attribute {attr!r}")
        target = getattr(target, part)
    return target


def resolve_reward(name: str) -> type[Reward] | Callable[..., Any]:
    """The :class:`Reward` subclass or reward function ``name`` names (registry, entry point or ``module:attr``);
    a ``KeyError`` or ``TypeError`` saying what is wrong otherwise. Params validation calls it, so a bad reward
    fails before any compute."""
    target = _import_target(name)
    if isinstance(target, type):
        if not issubclass(target, Reward):
            raise TypeError(
                f"reward {name!r}: {target.__name__} is not a vgrpo.rewards.base.Reward subclass (implement score(), "
                "or pass a function)"
            )
        return target
    if not callable(target):
        raise TypeError(f"reward {name!r}: {type(target).__name__} is neither a Reward subclass nor a function")
    return cast(Callable[..., Any], target)


def get_reward_class(name: str) -> type[Reward]:
    """The :class:`Reward` subclass ``name`` names; a ``KeyError`` or ``TypeError`` otherwise."""
    target = resolve_reward(name)
    if not isinstance(target, type):
        raise TypeError(f"reward {name!r} is a function, not a Reward subclass")
    return target


def reward_class(name: str) -> type[Reward]:
    """The class whose class methods answer for reward ``name`` before it is built: the :class:`Reward` subclass it
    names, or :class:`FunctionReward` (the defaults) for a function; a ``KeyError`` or ``TypeError`` otherwise."""
    target = resolve_reward(name)
    return target if isinstance(target, type) else FunctionReward


def build_reward(name: str, options: Mapping[str, Any] | None = None) -> Reward:
    """An instance of reward ``name`` built with keyword ``options`` (from a params file); a function is wrapped
    in :class:`FunctionReward` with ``options`` as its keyword arguments."""
    target = resolve_reward(name)
    if not isinstance(target, type):
        return FunctionReward(target, reward_key(name), options)
    try:
        return target(**dict(options or {}))
    except TypeError as exc:
        raise TypeError(f"reward {name!r}: bad options {sorted(options or {})}: {exc}") from exc
