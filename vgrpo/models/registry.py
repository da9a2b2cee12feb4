"""The model families vgrpo trains, by name: each is one adapter class that owns what is specific to its family.

A family is one diffusers text-to-image pipeline class and its transformer. Its
:class:`vgrpo.models.adapter.PipelineAdapter` subclass names them (``pipeline_class``, ``transformer_class``), the
components a folder of the family must have (``components``), its velocity wrapper (``velocity``: the transformer's
timestep and sign conventions), the LoRA target modules of its attention (``lora_targets``: what
``lora.target_modules`` means when a params file leaves it at its default), whether it samples videos (``video``),
and how its folder's configs give the image sides it can sample (``geometry``); its methods do the text encoding and
its cache, the latent geometry, the decoding and the sampler's shift. FSDP wraps the blocks the transformer class names
in diffusers' ``_no_split_modules`` (:mod:`vgrpo.parallel.fsdp`), and the LoRA export is written and read by the
pipeline class's own LoRA loader (:func:`vgrpo.checkpoints.state.save_lora`).

:data:`FAMILIES` names the shipped families' classes as ``"module:Class"`` strings, imported on first use, so importing
this module imports neither diffusers nor any family's code. A family of one's own, without forking, as rewards are
named (:mod:`vgrpo.rewards.registry`): ``family("my_package.models:MyAdapter")``, or a name another package registers
under the ``vgrpo.models`` entry-point group (``[project.entry-points."vgrpo.models"] mine =
"my_package.models:MyAdapter"``), which the loader then finds by its pipeline class. Adding a family to vgrpo: its
adapter module under ``vgrpo/models/`` and its line in :data:`FAMILIES` (``docs/extending.md``).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from vgrpo.import_target import ImportTargetError, import_target

if TYPE_CHECKING:
    from vgrpo.models.adapter import PipelineAdapter

    Family = type[PipelineAdapter]
else:
    Family = type

__all__ = [
    "ENTRY_POINT_GROUP",
    "FAMILIES",
    "Family",
    "UnknownFamilyError",
    "family",
    "family_for_pipeline",
    "family_for_transformer",
    "family_of",
]

ENTRY_POINT_GROUP = "vgrpo.models"
"""Packages register model families under this entry-point group (``name = "module:Class"``)."""

FAMILY_CLASSES: dict[str, str] = {
    "sd3": "vgrpo.models.sd3:SD3Adapter",
    "flux": "vgrpo.models.flux:FluxAdapter",
    "flux-kontext": "vgrpo.models.flux_kontext:FluxKontextAdapter",
    "z-image": "vgrpo.models.z_image:ZImageAdapter",
    "qwen-image": "vgrpo.models.qwen_image:QwenImageAdapter",
    "flux2": "vgrpo.models.flux2:Flux2Adapter",
    "wan": "vgrpo.models.wan:WanAdapter",
}
"""The shipped families' adapter classes by name, in the order lookups try them (FLUX.1 before Kontext, which shares
its transformer class)."""

REQUIRED = ("name", "pipeline_class", "transformer_class", "components", "lora_targets", "velocity")
"""The class attributes a family's adapter class must set (:class:`vgrpo.models.adapter.PipelineAdapter`)."""


class UnknownFamilyError(ValueError):
    """A family name, pipeline class or transformer class no family owns; the message lists the valid ones."""


def _import(target: str, what: str) -> Any:
    try:
        return import_target(target)
    except ImportTargetError as exc:
        raise UnknownFamilyError(f"model family {what!r}: {exc}") from exc


def _checked(cls: Any, what: str) -> Family:
    """``cls`` if it is a family's adapter class; an :class:`UnknownFamilyError` saying what it lacks otherwise."""
    from vgrpo.models.adapter import PipelineAdapter

    if not (isinstance(cls, type) and issubclass(cls, PipelineAdapter)):
        raise UnknownFamilyError(f"model family {what!r}: {cls!r} is not a vgrpo.models.adapter.PipelineAdapter class")
    missing = [a for a in REQUIRED if not hasattr(cls, a)]
    if missing:
        raise UnknownFamilyError(f"model family {what!r}: {cls.__name__} does not set {', '.join(missing)}")
    if inspect.isabstract(cls):
        abstract = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        raise UnknownFamilyError(f"model family {what!r}: {cls.__name__} is abstract ({abstract} not implemented)")
    return cls


class _Families(Mapping[str, Family]):
    """:data:`FAMILY_CLASSES` with each class imported when it is first looked up."""

    def __getitem__(self, name: str) -> Family:
        return _checked(_import(FAMILY_CLASSES[name], name), name)

    def __iter__(self) -> Iterator[str]:
        return iter(FAMILY_CLASSES)

    def __len__(self) -> int:
        return len(FAMILY_CLASSES)


FAMILIES: Mapping[str, Family] = _Families()
"""Every family vgrpo ships, by name: its adapter class."""


def _plugins() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _unknown(what: str, value: object, valid: list[str]) -> UnknownFamilyError:
    return UnknownFamilyError(f"no model family for {what} {value!r}; known: {', '.join(dict.fromkeys(valid))}")


def family(name: str) -> Family:
    """The family ``name`` names: a shipped one (:data:`FAMILIES`), an entry point's, or a ``module:Class`` path to
    a :class:`vgrpo.models.adapter.PipelineAdapter` subclass that sets the family's class attributes.

    Raises:
        UnknownFamilyError: listing the family names, or saying what the path lacks.
    """
    if name in FAMILY_CLASSES:
        return FAMILIES[name]
    plugins = _plugins()
    if name in plugins:
        return _checked(_import(plugins[name], name), name)
    if ":" in name:
        return _checked(_import(name, name), name)
    raise _unknown("name", name, [*sorted(FAMILIES), *sorted(plugins)])


def _all() -> Iterator[Family]:
    """The shipped families in :data:`FAMILY_CLASSES`' order, then the entry points' (read only when needed)."""
    yield from FAMILIES.values()
    for name, target in _plugins().items():
        yield _checked(_import(target, name), name)


def family_for_pipeline(pipeline_class: str) -> Family:
    """The family whose pipeline class is named ``pipeline_class`` (a ``model_index.json``'s ``_class_name``)."""
    for f in _all():
        if f.pipeline_class == pipeline_class:
            return f
    raise _unknown("pipeline class", pipeline_class, [f.pipeline_class for f in _all()])


def family_for_transformer(transformer_class: str) -> Family:
    """The family whose transformer class is named ``transformer_class``: the first in :data:`FAMILIES`' order where
    families share one (FLUX.1 and FLUX.1-Kontext: ``flux``), the one rule every lookup by transformer follows."""
    for f in _all():
        if f.transformer_class == transformer_class:
            return f
    raise _unknown("transformer class", transformer_class, [f.transformer_class for f in _all()])


def family_of(pipe: Any) -> Family:
    """The family of a loaded pipeline, by its class's exact name: a subclass may change what the pipeline conditions
    on, which the family's adapter would not know."""
    return family_for_pipeline(type(pipe).__name__)
