"""Numerical guards (vgrpo/training/guards.py): a NaN or Inf never reaches the weights; a stage skips the iteration,
reports it, and stops after too many in a row with its last checkpoint intact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.algorithms.helpers import make_config, make_policy
from tests.tiny_world import Recorder, run_tiny_stage, write_tiny_world
from tests.tiny_world import tiny_stage_config as _config
from vgrpo.algorithms import build_algorithm
from vgrpo.models.tiny import TINY_LATENT_SHAPE, tiny_conditioning
from vgrpo.training.guards import NonFiniteError, TrainingDiverged, check_finite, nonfinite_summary
from vgrpo.training.iteration import train_iteration
from vgrpo.training.optim import build_optimizer

PROMPTS = ["a red circle", "two blue squares"]


def test_check_finite_names_the_quantity_and_the_samples() -> None:
    values = torch.tensor([1.0, float("nan"), 2.0, float("inf")])
    assert nonfinite_summary(values) == {"count": 2, "of": 4, "nan": 1, "indices": [1, 3]}
    with pytest.raises(NonFiniteError, match="advantages") as err:
        check_finite("advantages", values, step=0)
    assert err.value.quantity == "advantages" and err.value.details["indices"] == [1, 3]
    check_finite("fine", torch.ones(3))


def _bright(samples: torch.Tensor, prompts: Any) -> dict[str, torch.Tensor]:
    return {"bright": samples.mean(dim=(1, 2, 3))}


def _nan_at_4(samples: torch.Tensor, prompts: Any) -> dict[str, torch.Tensor]:
    return {"bright": _bright(samples, prompts)["bright"].index_fill(0, torch.tensor([4]), float("nan"))}


def _inf(samples: torch.Tensor, prompts: Any) -> dict[str, torch.Tensor]:
    return {"bright": torch.full((samples.shape[0],), float("inf"))}


@pytest.mark.parametrize(
    ("reward_fn", "nan_gradient", "quantity"),
    [(_nan_at_4, False, "reward/bright"), (_inf, False, "reward/bright"), (_bright, True, "gradients")],
)
def test_a_non_finite_quantity_stops_the_update_before_it_is_applied(
    reward_fn: Any, nan_gradient: bool, quantity: str
) -> None:
    config = make_config({"name": "vgrpo", "n_mc": 2}, optim={"lr": 1e-2})
    policy = make_policy(config)
    params = {n: p for n, p in policy.named_parameters() if p.requires_grad}
    if nan_gradient:  # a backward that yields NaN in one adapter weight's gradient
        next(iter(params.values())).register_hook(lambda g: g * float("nan"))
    before = {n: p.detach().clone() for n, p in params.items()}
    algorithm = build_algorithm(config, policy=policy, latent_shape=TINY_LATENT_SHAPE)
    optimizer = build_optimizer(policy, config.optim)
    with pytest.raises(NonFiniteError) as err:
        train_iteration(
            policy=policy,
            algorithm=algorithm,
            optimizer=optimizer,
            reward_fn=reward_fn,
            prompts=PROMPTS,
            cond=tiny_conditioning(2),
            config=config,
            latent_shape=TINY_LATENT_SHAPE,
            generator=torch.Generator().manual_seed(0),
            iteration=0,
        )
    assert err.value.quantity == quantity
    expected_prompts = {_nan_at_4: [PROMPTS[1]], _inf: [PROMPTS[0]] * 3 + [PROMPTS[1]]}  # group size 3
    if reward_fn in expected_prompts:
        assert err.value.details["prompts"] == expected_prompts[reward_fn]
    assert all(torch.equal(before[n], p) for n, p in params.items())  # no step was taken
    assert not optimizer.state  # and Adam's moments were never touched
    assert all(p.grad is None for p in params.values())


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_world(tmp_path_factory.mktemp("guards"))


def _nan_pickscore_on_calls(monkeypatch: pytest.MonkeyPatch, calls: set[int] | None) -> None:
    """The world PickScore returns NaN for its first image on the given calls (0-based; None = every call)."""
    from vgrpo.rewards.preference import PickScore

    original, count = PickScore.score, {"n": 0}

    def score(self: Any, images: Any, prompts: Any, metadata: Any) -> Any:
        out = original(self, images, prompts, metadata)
        if calls is None or count["n"] in calls:
            out.scores[0] = float("nan")
        count["n"] += 1
        return out

    monkeypatch.setattr(PickScore, "score", score)


def test_a_stage_skips_the_iteration_with_a_nan_reward_and_finishes(
    world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file

    _nan_pickscore_on_calls(monkeypatch, {1})  # training iteration 1 (eval_prompts None: no evaluation calls)
    recorder = Recorder()
    cfg = _config(eval_prompts=None, keep_checkpoints=3)
    result = run_tiny_stage(cfg, world, "nan1", "nan1-lora", callbacks=recorder)
    events = recorder.skips
    assert [e["iteration"] for e in events] == [1] and events[0]["quantity"] == "reward/pickscore"
    assert "pickscore" in events[0]["reward_errors"][0] and events[0]["consecutive"] == 1
    assert [h["guard/skipped"] for h in result.history] == [0.0, 1.0, 0.0]
    assert result.skipped == events
    # Iteration 1 applied nothing: the weights after two iterations equal those after one; iteration 2 moved them.
    after = [load_file(world / "nan1/checkpoints" / f"iter-{i}" / "trainable.safetensors") for i in (1, 2, 3)]
    assert all(torch.equal(after[0][k], after[1][k]) for k in after[0])
    assert not all(torch.equal(after[1][k], after[2][k]) for k in after[1])
    assert (world / "nan1-lora" / "pytorch_lora_weights.safetensors").is_file()


def test_a_stage_stops_after_consecutive_skips_with_its_last_checkpoint_intact(
    world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vgrpo.checkpoints.state import latest_checkpoint

    _nan_pickscore_on_calls(monkeypatch, {1, 2, 3, 4})
    cfg = _config(eval_prompts=None, iterations=6, max_consecutive_skips=2, keep_checkpoints=6)
    with pytest.raises(TrainingDiverged, match=r"2 consecutive iterations .*reward/pickscore.* \[1, 2\]") as err:
        run_tiny_stage(cfg, world, "nan2", "nan2-lora")
    last = latest_checkpoint(world / "nan2" / "checkpoints")
    assert last is not None and str(last) in str(err.value)
    assert json.loads((last / "state.json").read_text())["consecutive_skips"] == 1
    assert not (world / "nan2-lora").exists()


def test_a_skipped_iteration_is_logged_to_mlflow_with_what_was_wrong(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    from tasks.stage import run_tracked_stage
    from tasks.tracking import tracking_uri

    _nan_pickscore_on_calls(monkeypatch, {0})
    stage = _config(eval_prompts=None, iterations=2, pipeline="base")
    uri = tracking_uri(tmp_path / "mlflow")
    out = run_tracked_stage(stage, None, str(tmp_path / "runs"), root=str(world), tracking_uri=uri)
    client = MlflowClient(uri)
    run = client.get_run(out.run_id)
    assert run.data.tags["vgrpo.skipped_iterations"] == "1"
    assert run.data.tags["vgrpo.guard.last_skip"] == "iteration 0: reward/pickscore"
    assert [m.value for m in client.get_metric_history(out.run_id, "guard/skipped")] == [1.0, 0.0]
    event_file = Path(client.download_artifacts(out.run_id, "guard/iter-00000.json", str(tmp_path)))
    event = json.loads(event_file.read_text())
    assert event["quantity"] == "reward/pickscore" and event["count"] == 1 and event["indices"] == [0]
