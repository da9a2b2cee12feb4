"""Reward registry: short names (what ``params/`` files say) to classes, imported only when selected; and a
user's own reward, without forking: a ``module:Class`` path to a :class:`Reward` subclass, a ``module:function``
path to a plain function, or a name another package registers under the ``vgrpo.rewards`` entry-point group.
:func:`reward_class` is the class that answers for a name before anything is built (the class methods of
:class:`Reward`: prompt checks, headline columns, evaluation summaries); a function's is :class:`FunctionReward`.

A function may have the ecosystem's signatures (:data:`FUNCTION_SIGNATURES`): vgrpo's and flow_grpo's
``fn(images, prompts, metadata)`` (flow_grpo's returns ``(scores, metadata)``: the scores are taken), or trl's
``reward_funcs`` style ``fn(completions, **kwargs) -> list[float]``. Any other signature, and a class that cannot be
built (abstract), is refused when the name is resolved, before any compute.

A reward's heavy dependencies (open_clip, mmdet, an HTTP client) are imported by its own module, so
selecting ``ocr`` never imports a CLIP model.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, Literal, cast

import numpy as np

from vgrpo.errors import ConfigError
from vgrpo.import_target import ImportTargetError, first_line, import_target
from vgrpo.rewards.base import HeadlineColumn, Metadata, Reward, RewardOutput, plain_scores

__all__ = [
    "ENTRY_POINT_GROUP",
    "FUNCTION_SIGNATURES",
    "REWARDS",
    "FunctionReward",
    "build_reward",
    "function_problem",
    "function_style",
    "get_reward_class",
    "refuse_reward_class",
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
    "source_similarity": "vgrpo.rewards.source:SourceSimilarityReward",
}


ENTRY_POINT_GROUP = "vgrpo.rewards"
"""Packages register rewards under this entry-point group: ``[project.entry-points."vgrpo.rewards"]
mine = "my_package.rewards:MyReward"``; params files then say ``name: mine``."""


FUNCTION_SIGNATURES = (
    "fn(images, prompts, metadata, **options) -> N scores (vgrpo's; flow_grpo's returns (scores, metadata))",
    "fn(completions, **kwargs) -> list[float] (trl's reward_funcs: the N images as completions=, prompts= and each "
    "prompt-row column by keyword, in any order)",
)
"""The reward function signatures accepted, as a refusal names them."""

FunctionStyle = Literal["vgrpo", "trl"]


def _accepts(signature: inspect.Signature, keyword: str) -> bool:
    params = signature.parameters.values()
    return keyword in signature.parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def function_style(fn: Callable[..., Any], name: str) -> FunctionStyle:
    """How reward function ``fn`` is called (:data:`FUNCTION_SIGNATURES`): ``"trl"`` when it takes ``completions``,
    else ``"vgrpo"`` (three positional arguments; flow_grpo's too). A ``TypeError`` naming both signatures when it
    takes neither."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function: nothing to inspect, called as vgrpo's
        return "vgrpo"
    if "completions" in signature.parameters:
        return "trl"
    try:
        signature.bind(None, None, None)
    except TypeError:
        expected = "; or ".join(FUNCTION_SIGNATURES)
        raise TypeError(
            f"reward {name!r}: {getattr(fn, '__name__', 'the function')}{signature} is not a reward function; "
            f"expected {expected}"
        ) from None
    return "vgrpo"


def function_problem(fn: Callable[..., Any], name: str, options: Mapping[str, Any]) -> str | None:
    """What keeps reward function ``fn`` from taking ``options`` as keywords (a misspelt option), or None."""
    style = function_style(fn, name)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        if style == "trl":
            signature.bind(completions=None, **_trl_keywords(signature, [], None, options), **options)
        else:
            signature.bind(None, None, None, **options)
    except TypeError as exc:
        expected = "; or ".join(FUNCTION_SIGNATURES)
        return f"reward {name!r}: options {sorted(options)}: {exc} (the signatures accepted: {expected})"
    return None


def refuse_reward_class(given: Any, where: str) -> None:
    """A :class:`ConfigError` naming ``where`` when ``given`` is a class where a reward object goes: a class is
    callable, so ``MyReward`` passed for ``MyReward()`` would be taken for a reward function and refused for its
    constructor's signature, or called with images as its constructor's arguments."""
    if isinstance(given, type):
        if issubclass(given, Reward):
            raise ConfigError(f"{where}: {given.__name__} is a Reward class; pass an instance: {given.__name__}()")
        raise ConfigError(f"{where}: {given.__name__} is a class; pass a Reward instance or a reward function")


TRL_RESERVED = frozenset({"completions", "prompts", "metadata"})


def _trl_keywords(
    signature: inspect.Signature,
    prompts: Sequence[str],
    metadata: Sequence[Metadata] | None,
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """The keywords a trl-style reward function gets besides ``completions``, as trl's ``GRPOTrainer`` passes them:
    ``prompts``, and every column of the prompt rows as a list over the samples (trl passes its dataset's columns
    so); vgrpo's ``metadata`` (the rows themselves) too. Each only where the function takes it (by name, or through
    ``**kwargs``) and no option of the same name is set."""
    given: dict[str, Any] = {"prompts": list(prompts), "metadata": metadata}
    rows = list(metadata or [])
    columns = sorted({key for row in rows for key in row} - TRL_RESERVED) if rows else []
    given.update({column: [row.get(column) for row in rows] for column in columns})
    return {k: v for k, v in given.items() if _accepts(signature, k) and k not in options}


class FunctionReward(Reward):
    """A plain function as a reward, in one of :data:`FUNCTION_SIGNATURES`: ``fn(images, prompts, metadata,
    **options)`` takes ``uint8 (N, H, W, 3)`` images, ``N`` prompts and ``N`` metadata rows (or ``None``) and returns
    ``N`` scores, a :class:`RewardOutput`, or flow_grpo's ``(scores, metadata)``; trl's ``fn(completions,
    **kwargs)`` gets the ``N`` images as a list of ``(H, W, 3)`` arrays, and ``prompts`` and ``metadata`` when it
    takes them, and returns ``N`` scores. Anything else fails as :class:`vgrpo.rewards.base.RewardFailed`, naming
    what it returned."""

    def __init__(self, fn: Callable[..., Any], name: str, options: Mapping[str, Any] | None = None):
        refuse_reward_class(fn, f"reward {name!r}")
        self.fn, self.options = fn, dict(options or {})
        self.style = function_style(fn, name)
        setattr(self, "name", name)  # noqa: B010 -- per instance: Reward declares the registry name a ClassVar

    @property
    def reads_metadata(self) -> bool:
        """A trl-style function that takes more than ``completions`` and ``prompts`` (the rows' columns, by name or
        through ``**kwargs``) reads the prompt rows; vgrpo's style gets them when another reward reads them."""
        if self.style != "trl":
            return False
        params = inspect.signature(self.fn).parameters
        return any(name not in ("completions", "prompts") for name in params)

    @classmethod
    def headline_columns(cls, key: str, options: Mapping[str, Any]) -> tuple[HeadlineColumn, ...]:
        """The mean ``eval/KEY``, named ``key`` (by default the function's name)."""
        return (HeadlineColumn(key, f"eval/{key}"),)

    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        if self.style == "trl":
            keywords = _trl_keywords(inspect.signature(self.fn), prompts, metadata, self.options)
            out = self.fn(completions=list(images), **keywords, **self.options)
        else:
            out = self.fn(images, list(prompts), metadata, **self.options)
            if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Mapping):
                out = out[0]  # flow_grpo's (scores, metadata)
        return out if isinstance(out, RewardOutput) else plain_scores(out)  # Reward.__call__ checks it


def reward_key(name: str, key: str | None = None) -> str:
    """A reward's name in logs and tables: ``key``, else the registry or entry-point name, else the attribute of a
    ``module:attribute`` path (``my_package.rewards:Brightness`` -> ``Brightness``)."""
    return key or name.rpartition(":")[2]


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
            raise KeyError(f"reward {name!r}: cannot load entry point {entry.value!r}: {first_line(exc)}") from exc
    if ":" not in name:
        plugins = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
        raise KeyError(
            f"unknown reward {name!r}; valid names: {sorted(REWARDS)}, entry points {plugins}, or 'module:Class' "
            "(a Reward subclass) / 'module:function' (scores from images, prompts, metadata)"
        )
    try:
        return import_target(name)
    except ImportTargetError as exc:
        raise KeyError(f"reward {name!r}: {exc}") from exc


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
        if inspect.isabstract(target):
            missing = ", ".join(f"{m}()" for m in sorted(getattr(target, "__abstractmethods__", ())))
            raise TypeError(f"reward {name!r}: class {target.__name__} cannot be built: it is abstract ({missing} "
                            "not implemented)")  # fmt: skip
        return target
    if not callable(target):
        raise TypeError(f"reward {name!r}: {type(target).__name__} is neither a Reward subclass nor a function")
    function_style(target, name)  # a signature no caller can call is refused now
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
