import pytest
import torch

from vgrpo.models import SD3Velocity, add_lora
from vgrpo.models.tiny import TINY_LATENT_SHAPE, tiny_conditioning, tiny_sd3_transformer
from vgrpo.policy import Conditioning, ParameterSnapshot, trainable_parameters


def test_conditioning_index_and_repeat():
    cond = tiny_conditioning(3)
    rep = cond.repeat_interleave(2)
    assert len(rep) == 6 and torch.equal(rep.prompt_embeds[2], cond.prompt_embeds[1])
    sub = rep.index(torch.tensor([5, 0]))
    assert torch.equal(sub.pooled_prompt_embeds[0], cond.pooled_prompt_embeds[2])
    with pytest.raises(ValueError, match="pooled_prompt_embeds has batch 2"):
        Conditioning(prompt_embeds=torch.zeros(3, 1, 1), pooled_prompt_embeds=torch.zeros(2, 1))


def test_conditioning_carries_an_editing_familys_condition_image_latents_through_every_row_operation():
    image = torch.arange(3.0).reshape(3, 1, 1, 1).expand(3, 2, 4, 4)
    cond = Conditioning(prompt_embeds=torch.zeros(3, 1, 1), image_latents=image)
    rep = cond.repeat_interleave(2)
    assert rep.image_latents is not None and rep.image_latents[:, 0, 0, 0].tolist() == [0, 0, 1, 1, 2, 2]
    sub = rep.index(torch.tensor([5, 0])).to("cpu", torch.float64)
    assert sub.image_latents is not None and sub.image_latents.dtype == torch.float64
    assert sub.image_latents[:, 0, 0, 0].tolist() == [2, 0]
    assert tiny_conditioning(2).image_latents is None  # text-to-image families carry none
    with pytest.raises(ValueError, match=r"image_latents must be \(B, C, h, w\) with B = 3"):
        Conditioning(prompt_embeds=torch.zeros(3, 1, 1), image_latents=torch.zeros(2, 2, 4, 4))


def test_parameter_snapshot_swaps_and_restores_and_ema():
    layer = torch.nn.Linear(2, 2)
    snap = ParameterSnapshot(list(layer.parameters()))
    with torch.no_grad():
        layer.weight.add_(1.0)
    live = layer.weight.detach().clone()
    with snap.swapped_in():
        torch.testing.assert_close(layer.weight.detach(), live - 1.0)
    torch.testing.assert_close(layer.weight.detach(), live)
    snap.ema_update(0.25)
    torch.testing.assert_close(snap.values[0], 0.25 * (live - 1.0) + 0.75 * live)
    with pytest.raises(ValueError, match="decay"):
        snap.ema_update(1.5)


def test_sd3_velocity_shapes_and_lora_starts_as_identity():
    transformer = tiny_sd3_transformer()
    policy = SD3Velocity(transformer)
    cond = tiny_conditioning(2)
    x = torch.randn(2, *TINY_LATENT_SHAPE, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.3, 0.9])
    with torch.no_grad():
        base = policy(x, t, cond)
    assert base.shape == x.shape
    add_lora(transformer, rank=4, alpha=8, target_modules=["to_q", "to_k", "to_v", "to_out.0"])
    with torch.no_grad():
        adapted = policy(x, t, cond)
    torch.testing.assert_close(adapted, base, rtol=0, atol=0)
    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert names and all("lora" in n for n in names)
    assert len(trainable_parameters(policy)) == len(names)


def test_add_lora_names_missing_target_modules():
    with pytest.raises(ValueError, match="not_a_layer"):
        add_lora(tiny_sd3_transformer(), rank=2, alpha=2, target_modules=["to_q", "not_a_layer"])
