"""The model registry (vgrpo/models/registry.py): names, the refusal of an unknown one, a family of one's own by
``module:Class`` or entry point, one rule for a transformer class two families share, and every family's adapter
class importable and consistent with diffusers' (the pipeline's transformer, the blocks FSDP wraps, the LoRA loader,
the LoRA targets present in the transformer)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from vgrpo.models.config import LoraConfig
from vgrpo.models.registry import (
    FAMILIES,
    UnknownFamilyError,
    family,
    family_for_pipeline,
    family_for_transformer,
)

OWN_FAMILY = "tests.models.own_family:OwnAdapter"


def test_the_registry_holds_the_families_by_name_and_refuses_an_unknown_one_listing_them() -> None:
    assert sorted(FAMILIES) == ["flux", "flux-kontext", "flux2", "qwen-image", "sd3", "wan", "z-image"]
    assert family("sd3").pipeline_class == "StableDiffusion3Pipeline"
    assert family_for_pipeline("FluxPipeline") is FAMILIES["flux"]
    assert family_for_transformer("ZImageTransformer2DModel") is FAMILIES["z-image"]
    # FLUX.1-Kontext shares FLUX.1's transformer class: the pipeline class tells them apart; the transformer's: FLUX.1.
    assert family_for_pipeline("FluxKontextPipeline") is FAMILIES["flux-kontext"]
    assert family_for_transformer("FluxTransformer2DModel") is FAMILIES["flux"]
    assert family_for_pipeline("WanPipeline") is family_for_transformer("WanTransformer3DModel") is FAMILIES["wan"]
    with pytest.raises(
        UnknownFamilyError, match=r"no model family for name 'hunyuan'; known: flux, flux-kontext, flux2, qwen-image, "
    ):
        family("hunyuan")
    with pytest.raises(
        UnknownFamilyError, match=r"pipeline class 'QwenImageEditPipeline'; known: StableDiffusion3Pipe"
    ):
        family_for_pipeline("QwenImageEditPipeline")
    with pytest.raises(UnknownFamilyError, match=r"transformer class 'LTXVideoTransformer3DModel'; known: SD3Transf"):
        family_for_transformer("LTXVideoTransformer3DModel")


def test_importing_the_registry_imports_no_family_code() -> None:
    code = (
        "import sys; import vgrpo.models.registry; "
        "print(sorted(m for m in sys.modules if m.startswith('diffusers') or m in "
        "('vgrpo.models.sd3', 'vgrpo.models.flux', 'vgrpo.models.z_image')))"
    )
    # vgrpo.models' package __init__ imports the SD3 and FLUX wrappers (and diffusers through peft's mixins) as it
    # did before the registry; what the registry itself adds is nothing: Z-Image's module stays unimported.
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "vgrpo.models.z_image" not in out


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_entry_imports_and_agrees_with_diffusers(name: str) -> None:
    from vgrpo.models.adapter import PipelineAdapter

    entry = FAMILIES[name]
    pipeline, transformer = entry.diffusers_pipeline(), entry.diffusers_transformer()
    assert pipeline.__name__ == entry.pipeline_class and transformer.__name__ == entry.transformer_class
    assert issubclass(entry, PipelineAdapter) and entry.name == name
    assert callable(entry.velocity)
    # The pipeline's constructor takes this transformer class and every component the entry requires.
    parameters = inspect.signature(pipeline.__init__).parameters
    assert set(entry.components) <= set(parameters)
    assert transformer.__name__ in str(parameters["transformer"].annotation)
    # FSDP wraps the blocks the transformer names (vgrpo/parallel/fsdp.py); the LoRA export uses the pipeline's loader.
    assert transformer._no_split_modules
    assert callable(pipeline.save_lora_weights) and callable(pipeline.load_lora_weights)


def test_sd3_and_flux_lora_targets_are_the_config_default() -> None:
    assert FAMILIES["sd3"].lora_targets == FAMILIES["flux"].lora_targets == LoraConfig().target_modules


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_default_lora_targets_are_the_family_s_and_an_explicit_list_is_kept(name: str) -> None:
    targets = FAMILIES[name].lora_targets
    assert LoraConfig().targets(targets) == targets
    assert LoraConfig(target_modules=("to_q", "to_v")).targets(targets) == ("to_q", "to_v")


def test_a_transformer_class_two_families_share_finds_one_family_everywhere() -> None:
    # FLUX.1 and FLUX.1-Kontext share FluxTransformer2DModel: every lookup by transformer (the LoRA export's among
    # them) finds FLUX.1, the first in the registry's order, and both pipelines write LoRA files with one mixin.
    from diffusers import FluxKontextPipeline, FluxPipeline

    assert FAMILIES["flux-kontext"].transformer_class == FAMILIES["flux"].transformer_class
    assert family_for_transformer("FluxTransformer2DModel").diffusers_pipeline() is FluxPipeline
    assert FluxKontextPipeline.save_lora_weights.__func__ is FluxPipeline.save_lora_weights.__func__


def test_a_family_of_one_s_own_by_module_class_or_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    from tests.models.own_family import OwnAdapter
    from vgrpo.models import registry

    assert family(OWN_FAMILY) is OwnAdapter
    with pytest.raises(UnknownFamilyError, match=r"no model family for pipeline class 'OwnPipeline'"):
        family_for_pipeline("OwnPipeline")  # a path names a family; only an entry point makes the loader find it
    with pytest.raises(UnknownFamilyError, match=r"'tests.models.own_family:Missing'.*has no attribute 'Missing'"):
        family("tests.models.own_family:Missing")
    with pytest.raises(UnknownFamilyError, match=r"LoraConfig'>? is not a vgrpo.models.adapter.PipelineAdapter class"):
        family("vgrpo.models.config:LoraConfig")
    with pytest.raises(UnknownFamilyError, match=r"Incomplete does not set pipeline_class, transformer_class"):
        family("tests.models.own_family:Incomplete")
    plugin = EntryPoint(name="own", value=OWN_FAMILY, group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [plugin] if group == plugin.group else [])
    assert family("own") is family_for_pipeline("OwnPipeline") is OwnAdapter
    assert family_for_transformer("SD3Transformer2DModel") is FAMILIES["sd3"]  # the shipped families come first
    known = r"known: flux, flux-kontext, flux2, qwen-image, sd3, wan, z-image, own$"
    with pytest.raises(UnknownFamilyError, match=known):
        family("hunyuan")


@pytest.mark.parametrize(
    ("name", "transformer", "vae", "expected"),
    [
        ("sd3", {"patch_size": 2, "sample_size": 128, "pos_embed_max_size": 384}, [1, 2, 3, 4], (8, 2, 1024, 6144)),
        ("sd3", {"patch_size": 2, "sample_size": 64}, [1, 2, 3, 4], (8, 2, 512, None)),
        ("flux", {"patch_size": 1}, [1, 2, 3, 4], (8, 2, 1024, None)),
        ("flux-kontext", {"patch_size": 1}, [1, 2, 3, 4], (8, 2, 1024, None)),
        ("z-image", {"all_patch_size": [2]}, [1, 2, 3, 4], (8, 2, 1024, None)),
        ("qwen-image", {"patch_size": 2}, None, (8, 2, 1024, None)),
        ("flux2", {"patch_size": 1}, [1, 2, 3, 4], (8, 2, 1024, None)),
        ("wan", {"patch_size": [1, 2, 2]}, None, (8, 2, 480, None)),
    ],
)
def test_each_family_reads_its_image_sides_from_the_configs(
    name: str, transformer: dict[str, object], vae: list[int] | None, expected: tuple[int, int, int, int | None]
) -> None:
    # An AutoencoderKL's block_out_channels give 2 ** (len - 1); Qwen-Image's video VAE 2 ** len(temperal_downsample).
    # Wan's names its spatial and temporal factors (scale_factor_spatial, scale_factor_temporal).
    vae_config = (
        {"block_out_channels": vae}
        if vae
        else {"temperal_downsample": [False, True, True], "scale_factor_spatial": 8, "scale_factor_temporal": 4}
    )
    sides = FAMILIES[name].geometry(transformer, vae_config)
    assert (sides.vae_scale_factor, sides.patch_size, sides.default_resolution, sides.max_resolution) == expected
    assert sides.frames_factor == (4 if FAMILIES[name].video else None)  # Wan's VAE: 4x in time


@pytest.mark.parametrize(
    ("builder", "blocks"),
    [
        ("tiny_flux_pipeline", {"FluxTransformerBlock": 1, "FluxSingleTransformerBlock": 1}),
        ("tiny_z_image_pipeline", {"ZImageTransformerBlock": 3}),  # two refiners and one main layer
        ("tiny_qwen_image_pipeline", {"QwenImageTransformerBlock": 1}),
    ],
)
def test_fsdp_finds_the_blocks_of_each_family_s_transformer(builder: str, blocks: dict[str, int]) -> None:
    from collections import Counter

    from vgrpo.models import tiny
    from vgrpo.parallel.fsdp import _blocks

    transformer = getattr(tiny, builder)(seed=0).transformer
    assert Counter(type(b).__name__ for b in _blocks(transformer)) == blocks
