"""Pretraining of the embedded default: SD3's timestep density, the flow-matching loss, a short run that
lowers the loss, and a resumed run that ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.models.test_embedded import TINY
from vgrpo.flow import interpolate
from vgrpo.models.embedded import build_text_encoder
from vgrpo.models.pipeline import load_sd3_pipeline
from vgrpo.policy import Conditioning
from vgrpo.world.config import PretrainConfig, VAETrainConfig
from vgrpo.world.pretrain import flow_matching_loss, logit_normal_timesteps, pretrain


def tiny_pretrain_config(**overrides: object) -> PretrainConfig:
    base = dict(
        model=TINY,
        vae=VAETrainConfig(steps=15, batch_size=8, lr=3e-3),
        steps=40,
        batch_size=16,
        lr=3e-3,
        warmup_steps=5,
        ema_decay=0.9,
        eval_every=10,
        checkpoint_every=10,
    )
    return PretrainConfig.model_validate(base | overrides)


def test_logit_normal_timesteps_follow_sd3_density() -> None:
    t = logit_normal_timesteps(200_000, 0.5, 0.8, torch.Generator().manual_seed(0))
    assert t.min() > 0 and t.max() < 1
    logit = torch.log(t / (1 - t))
    assert abs(logit.mean().item() - 0.5) < 0.01 and abs(logit.std().item() - 0.8) < 0.01


def test_flow_matching_loss_is_the_velocity_regression() -> None:
    x0, eps = torch.randn(3, 2, 4, 4), torch.randn(3, 2, 4, 4)
    t = torch.tensor([0.1, 0.5, 0.9])

    def oracle(x_t: torch.Tensor, t_: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        assert torch.allclose(x_t, interpolate(x0, eps, t_))
        return eps - x0 + 0.5  # the true velocity, off by 0.5 everywhere

    cond = Conditioning(prompt_embeds=torch.zeros(3, 1, 1))
    assert flow_matching_loss(oracle, x0, cond, t, eps).item() == pytest.approx(0.25)  # type: ignore[arg-type]


def _losses(history: list[dict[str, float]]) -> list[float]:
    return [h["loss"] for h in history]


def test_short_pretraining_lowers_the_loss(tmp_path: Path) -> None:
    # Frozen random text encoders here; the resume test below covers jointly trained ones.
    config = tiny_pretrain_config(train_text_encoders=False)
    final = pretrain(config, tmp_path, evaluate=lambda *_: {}, log=lambda _: None)
    history = json.loads((final / "pretrain_history.json").read_text())
    losses = _losses(history)
    assert len(losses) == 4
    assert losses[-1] < 0.9 * losses[0] and losses == sorted(losses, reverse=True), losses
    pipe = load_sd3_pipeline(final)  # the saved result is a loadable SD3 pipeline with a fitted latent scale
    assert pipe.vae.config.scaling_factor != 1.0 and pipe.vae.config.shift_factor != 0.0
    fresh = build_text_encoder(TINY, pipe.tokenizer, seed=config.seed + 2)  # the untrained first encoder
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, pipe.text_encoder.state_dict()[key]), key


class _Crash(RuntimeError):
    pass


def test_resumed_pretraining_is_bit_identical(tmp_path: Path) -> None:
    cfg = tiny_pretrain_config(steps=30)
    assert cfg.train_text_encoders
    straight = pretrain(cfg, tmp_path / "straight", log=lambda _: None)

    def crash_at_30(adapter: object, velocity: object, step: int) -> dict[str, float]:
        if step == 30:  # after the step-30 update, before its checkpoint
            raise _Crash
        return {}

    with pytest.raises(_Crash):
        pretrain(cfg, tmp_path / "resumed", evaluate=crash_at_30, log=lambda _: None)
    # The newest checkpoint and each evaluated step's (every 10) are kept.
    assert sorted(p.name for p in (tmp_path / "resumed" / "checkpoints").iterdir()) == ["step-10", "step-20"]
    logs: list[str] = []
    resumed = pretrain(cfg, tmp_path / "resumed", log=logs.append)
    assert any("resuming" in line for line in logs)
    a, b = load_sd3_pipeline(straight), load_sd3_pipeline(resumed)
    for name in ("transformer", "vae", "text_encoder", "text_encoder_2"):
        sa, sb = getattr(a, name).state_dict(), getattr(b, name).state_dict()
        for key in sa:
            assert torch.equal(sa[key], sb[key]), f"{name}.{key}"


def test_checkpoint_of_other_params_is_not_resumed(tmp_path: Path) -> None:
    pretrain(tiny_pretrain_config(steps=10), tmp_path, log=lambda _: None)
    logs: list[str] = []
    pretrain(tiny_pretrain_config(steps=10, lr=1e-3), tmp_path, log=logs.append)
    assert any("other params: starting afresh" in line for line in logs)
    assert not any("resuming" in line for line in logs)


def test_a_release_step_releases_that_steps_checkpoint_without_training_again(tmp_path: Path) -> None:
    cfg = tiny_pretrain_config(steps=20)
    pretrain(cfg, tmp_path / "run", tmp_path / "last", evaluate=lambda *_: {}, log=lambda _: None)
    logs: list[str] = []
    released = pretrain(
        cfg.model_copy(update={"release_step": 10}), tmp_path / "run", tmp_path / "ten", log=logs.append
    )
    assert any("resuming from" in line and line.endswith("step-10") for line in logs)
    kept = load_sd3_pipeline(tmp_path / "run" / "checkpoints" / "step-10" / "pipeline").transformer.state_dict()
    for key, value in load_sd3_pipeline(released).transformer.state_dict().items():
        assert torch.equal(value, kept[key]), key
    with pytest.raises(ValueError, match="release_step=30 is past"):
        tiny_pretrain_config(steps=20, release_step=30)


def test_the_decoder_phase_trains_the_decoder_alone(tmp_path: Path) -> None:
    plain = load_sd3_pipeline(pretrain(tiny_pretrain_config(steps=1), tmp_path / "a", log=lambda _: None)).vae
    vae = VAETrainConfig(steps=15, batch_size=8, lr=3e-3, decoder_steps=5, text_band_weight=4.0)
    tuned = load_sd3_pipeline(pretrain(tiny_pretrain_config(steps=1, vae=vae), tmp_path / "b", log=lambda _: None)).vae
    for key, value in plain.encoder.state_dict().items():
        assert torch.equal(value, tuned.encoder.state_dict()[key]), key
    assert any(not torch.equal(v, tuned.decoder.state_dict()[k]) for k, v in plain.decoder.state_dict().items())
