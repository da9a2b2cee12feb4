"""The model families vgrpo trains, by name: each entry owns what is specific to its family.

A family is one diffusers text-to-image pipeline class and its transformer. Its :class:`ModelFamily` entry names
the pipeline class a folder's ``model_index.json`` carries and the components that folder must have, the
:class:`vgrpo.models.adapter.PipelineAdapter` (text encoding and its cache, latent geometry, decoding, the
sampler's shift) and the velocity wrapper (the transformer's timestep and sign conventions), the LoRA target
modules of the family's attention, and how its folder's configs give the image sides it can sample
(:mod:`vgrpo.models.geometry`). FSDP wraps the blocks the transformer class names in diffusers'
``_no_split_modules`` (:mod:`vgrpo.parallel.fsdp`), and the LoRA export is written and read by the pipeline class's
own LoRA loader (:func:`vgrpo.checkpoints.state.save_lora`).

Classes are named as ``"module:attribute"`` strings and imported on first use, so importing this module imports
neither diffusers nor any family's code. Adding a family: an adapter module under ``vgrpo/models/``, an entry
in :data:`FAMILIES`, a tiny builder in :mod:`vgrpo.models.tiny` and its tests (``docs/extending.md``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FAMILIES",
    "FamilyGeometry",
    "ModelFamily",
    "UnknownFamilyError",
    "family",
    "family_for_pipeline",
    "family_for_transformer",
    "family_of",
]


class UnknownFamilyError(ValueError):
    """A family name, pipeline class or transformer class no entry of :data:`FAMILIES` owns; the message lists the
    valid ones."""


@dataclass(frozen=True)
class FamilyGeometry:
    """Image sides a pipeline folder can sample, from its configs: every side a multiple of
    ``vae_scale_factor * patch_size`` pixels, at most ``max_resolution`` (None = no table bounds it)."""

    vae_scale_factor: int
    patch_size: int
    default_resolution: int
    max_resolution: int | None
    frames_factor: int | None = None
    """A video family's temporal downsampling (frames are ``frames_factor * k + 1``); None for an image family."""


GeometryReader = Callable[[Mapping[str, Any], Mapping[str, Any]], FamilyGeometry]
"""``(transformer/config.json, vae/config.json) -> FamilyGeometry``; KeyError/TypeError/ValueError/IndexError when a
config lacks what it needs."""


def _image_vae_scale(vae: Mapping[str, Any]) -> int:
    # diffusers' AutoencoderKL pipelines: 2 ** (len(block_out_channels) - 1).
    return int(2 ** (len(vae["block_out_channels"]) - 1))


def _sd3_geometry(transformer: Mapping[str, Any], vae: Mapping[str, Any]) -> FamilyGeometry:
    # SD3's PatchEmbed holds pos_embed_max_size patches a side (192 or 384 in the family's checkpoints).
    vae_scale_factor = _image_vae_scale(vae)
    patch = int(transformer["patch_size"])
    table = transformer.get("pos_embed_max_size")
    return FamilyGeometry(
        vae_scale_factor,
        patch,
        int(transformer["sample_size"]) * vae_scale_factor,
        None if table is None else int(table) * patch * vae_scale_factor,
    )


FLUX_DEFAULT_SAMPLE_SIZE = 128
"""``FluxPipeline.default_sample_size``: its default side in latent pixels (1024 px at the VAE's 8x)."""


def _flux_geometry(transformer: Mapping[str, Any], vae: Mapping[str, Any]) -> FamilyGeometry:
    # FLUX packs 2 x 2 latent patches itself (its transformer's patch_size is 1) and has rotary positions: no table.
    vae_scale_factor = _image_vae_scale(vae)
    return FamilyGeometry(vae_scale_factor, 2, FLUX_DEFAULT_SAMPLE_SIZE * vae_scale_factor, None)


Z_IMAGE_DEFAULT_RESOLUTION = 1024
"""``ZImagePipeline.__call__``'s default height and width in pixels."""


def _z_image_geometry(transformer: Mapping[str, Any], vae: Mapping[str, Any]) -> FamilyGeometry:
    # The transformer patchifies with all_patch_size[0] (the pipeline's default patch_size=2); rotary positions.
    return FamilyGeometry(
        _image_vae_scale(vae), int(transformer["all_patch_size"][0]), Z_IMAGE_DEFAULT_RESOLUTION, None
    )


QWEN_IMAGE_DEFAULT_SAMPLE_SIZE = 128
"""``QwenImagePipeline.default_sample_size``: its default side in latent pixels (1024 px at the VAE's 8x)."""


def _qwen_image_geometry(transformer: Mapping[str, Any], vae: Mapping[str, Any]) -> FamilyGeometry:
    # A video VAE: 2 ** len(temperal_downsample) spatially (QwenImagePipeline); FLUX's 2 x 2 packing, rotary positions.
    vae_scale_factor = int(2 ** len(vae["temperal_downsample"]))
    return FamilyGeometry(vae_scale_factor, 2, QWEN_IMAGE_DEFAULT_SAMPLE_SIZE * vae_scale_factor, None)


FLUX2_DEFAULT_SAMPLE_SIZE = 128
"""``Flux2Pipeline.default_sample_size``: its default side in latent pixels (1024 px at the VAE's 8x)."""


def _flux2_geometry(transformer: Mapping[str, Any], vae: Mapping[str, Any]) -> FamilyGeometry:
    # The pipeline patchifies 2 x 2 VAE latent pixels into channels (its transformer's patch_size is 1); rotary
    # positions: no table.
    vae_scale_factor = _image_vae_scale(vae)
    return FamilyGeometry(vae_scale_factor, 2, FLUX2_DEFAULT_SAMPLE_SIZE * vae_scale_factor, None)


WAN_DEFAULT_RESOLUTION = 480
"""``WanPipeline.__call__``'s default height in pixels (its width is 832; vgrpo samples squares)."""


def _wan_geometry(transformer: Mapping[str, Any], vae: Mapping[str, Any]) -> FamilyGeometry:
    # A video VAE naming its spatial factor (8 for Wan2.1); the transformer patchifies (1, 2, 2); rotary positions.
    return FamilyGeometry(
        int(vae["scale_factor_spatial"]),
        int(transformer["patch_size"][1]),
        WAN_DEFAULT_RESOLUTION,
        None,
        frames_factor=int(vae["scale_factor_temporal"]),
    )


def _import(target: str) -> Any:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


_SD3_FLUX_ATTENTION = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")


@dataclass(frozen=True)
class ModelFamily:
    """One family's entry (module docstring).

    Attributes:
        name: the family's name in the registry.
        pipeline_class: the diffusers pipeline class (``model_index.json``'s ``_class_name``).
        transformer_class: the diffusers transformer class the pipeline holds.
        components: the components a folder of this family must have (optional ones, like SD3's T5, left out).
        adapter: ``"module:Class"`` of the family's :class:`vgrpo.models.adapter.PipelineAdapter`.
        velocity: ``"module:Class"`` of its velocity wrapper: ``(transformer) -> VelocityModel``.
        lora_targets: the module names LoRA adapts in the family's attention (``lora.target_modules``).
        geometry: reads the image sides from the folder's configs.
        video: the family samples videos (its adapter takes ``num_frames``; its latents carry a frame axis).
    """

    name: str
    pipeline_class: str
    transformer_class: str
    components: tuple[str, ...]
    adapter: str
    velocity: str
    lora_targets: tuple[str, ...]
    geometry: GeometryReader
    video: bool = False

    def adapter_class(self) -> Any:
        """The adapter class, imported now."""
        return _import(self.adapter)

    def velocity_class(self) -> Any:
        """The velocity wrapper class, imported now."""
        return _import(self.velocity)

    def diffusers_pipeline(self) -> Any:
        """The diffusers pipeline class, imported now."""
        import diffusers

        return getattr(diffusers, self.pipeline_class)

    def diffusers_transformer(self) -> Any:
        """The diffusers transformer class, imported now."""
        import diffusers

        return getattr(diffusers, self.transformer_class)


_TWO_TEXT_ENCODERS = ("transformer", "vae", "scheduler", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")
_ONE_TEXT_ENCODER = ("transformer", "vae", "scheduler", "text_encoder", "tokenizer")

FAMILIES: dict[str, ModelFamily] = {
    f.name: f
    for f in (
        ModelFamily(
            name="sd3",
            pipeline_class="StableDiffusion3Pipeline",
            transformer_class="SD3Transformer2DModel",
            components=_TWO_TEXT_ENCODERS,  # T5 (text_encoder_3) is optional: the embedded default has none
            adapter="vgrpo.models.sd3:SD3Adapter",
            velocity="vgrpo.models.sd3:SD3Velocity",
            lora_targets=_SD3_FLUX_ATTENTION,
            geometry=_sd3_geometry,
        ),
        ModelFamily(
            name="flux",
            pipeline_class="FluxPipeline",
            transformer_class="FluxTransformer2DModel",
            components=_TWO_TEXT_ENCODERS,
            adapter="vgrpo.models.flux:FluxAdapter",
            velocity="vgrpo.models.flux:FluxVelocity",
            lora_targets=_SD3_FLUX_ATTENTION,  # the single-stream blocks have q/k/v but no to_out
            geometry=_flux_geometry,
        ),
        ModelFamily(
            name="flux-kontext",
            pipeline_class="FluxKontextPipeline",
            transformer_class="FluxTransformer2DModel",  # FLUX.1's: family_for_transformer finds "flux" first
            components=_TWO_TEXT_ENCODERS,
            adapter="vgrpo.models.flux_kontext:FluxKontextAdapter",
            velocity="vgrpo.models.flux_kontext:FluxKontextVelocity",
            lora_targets=_SD3_FLUX_ATTENTION,
            geometry=_flux_geometry,  # FluxKontextPipeline.default_sample_size is FLUX.1's
        ),
        ModelFamily(
            name="z-image",
            pipeline_class="ZImagePipeline",
            transformer_class="ZImageTransformer2DModel",
            components=_ONE_TEXT_ENCODER,
            adapter="vgrpo.models.z_image:ZImageAdapter",
            velocity="vgrpo.models.z_image:ZImageVelocity",
            lora_targets=("to_q", "to_k", "to_v", "to_out.0"),  # one stream: no context projections
            geometry=_z_image_geometry,
        ),
        ModelFamily(
            name="qwen-image",
            pipeline_class="QwenImagePipeline",
            transformer_class="QwenImageTransformer2DModel",
            components=_ONE_TEXT_ENCODER,
            adapter="vgrpo.models.qwen_image:QwenImageAdapter",
            velocity="vgrpo.models.qwen_image:QwenImageVelocity",
            lora_targets=_SD3_FLUX_ATTENTION,  # double-stream joint attention, as SD3's and FLUX's
            geometry=_qwen_image_geometry,
        ),
        ModelFamily(
            name="flux2",
            pipeline_class="Flux2Pipeline",
            transformer_class="Flux2Transformer2DModel",
            components=_ONE_TEXT_ENCODER,
            adapter="vgrpo.models.flux2:Flux2Adapter",
            velocity="vgrpo.models.flux2:Flux2Velocity",
            # The double-stream blocks' joint attention, and the single-stream blocks' fused q/k/v + MLP-in
            # projection (their output projection is named to_out, which would also match the double blocks' list).
            lora_targets=(*_SD3_FLUX_ATTENTION, "to_qkv_mlp_proj"),
            geometry=_flux2_geometry,
        ),
        ModelFamily(
            name="wan",
            pipeline_class="WanPipeline",
            transformer_class="WanTransformer3DModel",
            components=_ONE_TEXT_ENCODER,
            adapter="vgrpo.models.wan:WanAdapter",
            velocity="vgrpo.models.wan:WanVelocity",
            lora_targets=("to_q", "to_k", "to_v", "to_out.0"),  # each block's self- and cross-attention
            geometry=_wan_geometry,
            video=True,
        ),
    )
}
"""Every family vgrpo trains, by name."""


def _unknown(what: str, value: object, valid: list[str]) -> UnknownFamilyError:
    return UnknownFamilyError(f"no model family for {what} {value!r}; known: {', '.join(valid)}")


def family(name: str) -> ModelFamily:
    """The entry named ``name``.

    Raises:
        UnknownFamilyError: listing the family names.
    """
    if name not in FAMILIES:
        raise _unknown("name", name, sorted(FAMILIES))
    return FAMILIES[name]


def family_for_pipeline(pipeline_class: str) -> ModelFamily:
    """The entry whose pipeline class is named ``pipeline_class`` (a ``model_index.json``'s ``_class_name``)."""
    for f in FAMILIES.values():
        if f.pipeline_class == pipeline_class:
            return f
    raise _unknown("pipeline class", pipeline_class, [f.pipeline_class for f in FAMILIES.values()])


def family_for_transformer(transformer_class: str) -> ModelFamily:
    """The entry whose transformer class is named ``transformer_class``."""
    for f in FAMILIES.values():
        if f.transformer_class == transformer_class:
            return f
    raise _unknown("transformer class", transformer_class, [f.transformer_class for f in FAMILIES.values()])


def family_of(pipe: Any) -> ModelFamily:
    """The entry of a loaded pipeline, by its class's exact name: a subclass may change what the pipeline conditions
    on, which the family's adapter would not know."""
    return family_for_pipeline(type(pipe).__name__)
