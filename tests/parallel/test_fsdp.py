"""FSDP (``distributed.strategy: fsdp``): two gloo processes with the tiny SD3 transformer sharded by torch's FSDP2
against one unsharded process, in full fine-tuning; the snapshots every algorithm keeps, on sharded weights; the
sharded checkpoints (no pickle, checked before loading) and the export of a whole pipeline."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.algorithms.helpers import make_config, make_policy
from tests.distributed_worker import FSDP_CASES, run_full_case
from tests.parallel.test_distributed import PARAM_ATOL, _case, _launch_two_processes
from tests.tiny_world import tiny_stage_config as _config
from vgrpo.checkpoints.resume import ResumableRun, TrainingState
from vgrpo.checkpoints.sharded import load_sharded_state, save_sharded_state
from vgrpo.checkpoints.state import Checkpointed, CheckpointError
from vgrpo.errors import ConfigError
from vgrpo.models.tiny import TINY_LATENT_SHAPE, tiny_conditioning
from vgrpo.parallel.distributed import Distributed
from vgrpo.policy import ParameterSnapshot, trainable_parameters
from vgrpo.training.optim import build_optimizer

STAGE_ATOL = 5e-5
"""Two FSDP processes against one after a stage of two iterations (the test explains the band)."""


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """Every case of :data:`FSDP_CASES` on two processes with FSDP, as rank 0 wrote it."""
    out = tmp_path_factory.mktemp("fsdp") / "two.safetensors"
    _launch_two_processes(["-m", "tests.distributed_worker", "--fsdp", str(out)])
    return load_file(str(out))


def _compare_weights(name: str, two: dict[str, torch.Tensor], one: dict[str, torch.Tensor]) -> None:
    """Every trained weight and snapshot of ``two`` within :data:`PARAM_ATOL` of ``one``'s, and the training moved
    the weights far more than that."""
    assert set(one) == set(two)
    initial = dict(make_policy(make_config(FSDP_CASES[name]["algorithm"], lora=None)).named_parameters())
    moved = 0.0
    for key in (k for k in one if k.startswith(("param.", "snapshot."))):
        torch.testing.assert_close(two[key], one[key], rtol=0, atol=PARAM_ATOL)
    for key in (k for k in one if k.startswith("param.")):
        moved = max(moved, (one[key] - initial[key.removeprefix("param.")]).abs().max().item())
    assert moved > 100 * PARAM_ATOL


def test_fsdp_on_two_processes_matches_one_process_after_two_optimizer_steps(fsdp_run):
    two = _case(fsdp_run, "full_vgrpo")
    one = _case(run_full_case("full_vgrpo", Distributed()), "full_vgrpo")
    _compare_weights("full_vgrpo", two, one)
    # Parameters, gradients and AdamW's moments are sharded: rank 0 holds about half of each.
    for kind in ("params", "grads", "moments"):
        assert 0 < two[f"numel.{kind}"].item() < 0.6 * one[f"numel.{kind}"].item(), kind


@pytest.mark.parametrize(("name", "snapshot"), [("full_vgrpo_ref_kl", "reference"), ("full_diffusion_nft", "old")])
def test_fsdp_snapshots_swap_sharded_weights_and_match_one_process(fsdp_run, name, snapshot):
    """V-GRPO's KL reference and DiffusionNFT's EMA "old" policy, kept as shards and swapped in for the second
    iteration's rollout / preparation, train the same weights as one process does with whole ones."""
    two = _case(fsdp_run, name)
    one = _case(run_full_case(name, Distributed()), name)
    _compare_weights(name, two, one)
    probe, live = f"probe.{snapshot}", "probe.live"
    assert (one[probe] - one[live]).abs().max().item() > 1e-2  # the snapshot is not the live weights
    torch.testing.assert_close(two[probe], one[probe], rtol=0, atol=PARAM_ATOL)  # the snapshot's weights ran
    assert torch.equal(two["probe.after_swaps"], two[live])  # and the live ones are back, bit for bit


def test_fsdp_needs_a_full_fine_tune():
    with pytest.raises(ConfigError, match="strategy=fsdp shards a full fine-tune: set lora: null"):
        make_config({"name": "vgrpo"}, distributed={"strategy": "fsdp"})
    assert make_config({"name": "vgrpo"}, lora=None, distributed={"strategy": "fsdp"}).distributed.strategy == "fsdp"
    assert make_config({"name": "vgrpo"}).distributed.strategy == "ddp"  # the default keeps whole weights per rank


# --- a stage: sharded checkpoints, resume after a kill, evaluation and export -----------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny_world import WORLD_PICK, write_tiny_world

    root = write_tiny_world(tmp_path_factory.mktemp("world"))
    stage = _config(
        lora=None,
        distributed={"strategy": "fsdp"},
        iterations=2,
        checkpoint_every=1,
        rollout={"prompts_per_iteration": 2, "group_size": 4, "num_steps": 4, "shift": None, "micro_batch_size": 4},
        optim={"lr": 1e-3, "micro_batch_size": 4},
        rewards=[{"name": "pickscore", "options": {"path": str(WORLD_PICK)}}],  # continuous: no flips at 1e-6
    )
    (root / "fsdp.yaml").write_text(yaml.safe_dump(stage.model_dump(mode="json")))
    return root


def _transformer(pipeline_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(pipeline_dir / "transformer" / "diffusion_pytorch_model.safetensors")


@pytest.mark.slow
def test_fsdp_stage_killed_after_writing_a_checkpoint_resumes_to_the_uninterrupted_weights(world):
    """Two FSDP processes SIGKILLed while writing the second checkpoint (their shards on disk, not yet published)
    leave the first one; a new launch resumes from it, evaluates on every rank, exports the whole pipeline, and ends
    with the weights of an uninterrupted launch, bit for bit, and near one process's."""
    from vgrpo.config import StageConfig
    from vgrpo.training.stage import run_stage

    def launch(name: str, *kill: str) -> list[str]:
        return [
            "-m",
            "tests.distributed_worker",
            "--stage",
            str(world / "fsdp.yaml"),
            str(world),
            str(world / name),
            str(world / f"{name}_out"),
            *kill,
        ]

    with pytest.raises(AssertionError):  # the kill makes the launch exit non-zero
        _launch_two_processes(launch("cut", "2"))
    saved = sorted(p.name for p in (world / "cut" / "checkpoints").iterdir())
    assert saved[-1] == "iter-1" and any(name.startswith(".iter-2.tmp-") for name in saved), saved
    assert not (world / "cut_out").exists()
    _launch_two_processes(launch("cut"))
    summary = json.loads((world / "cut_out.json").read_text())
    assert summary["resumed_from"] == 1
    assert sorted(p.name for p in (world / "cut" / "checkpoints").iterdir()) == ["iter-1", "iter-2"]
    assert len(list((world / "cut" / "checkpoints" / "iter-2" / "shards").iterdir())) == 2  # one file per rank
    _launch_two_processes(launch("whole"))
    cut, whole = _transformer(world / "cut_out"), _transformer(world / "whole_out")
    assert set(cut) == set(whole) and all(torch.equal(cut[k], whole[k]) for k in cut)

    config = StageConfig.model_validate(yaml.safe_load((world / "fsdp.yaml").read_text()))
    one = run_stage(config, pipeline_dir=Path("base"), work_dir=world / "one", out_dir=world / "one_out", root=world)
    single, initial = _transformer(world / "one_out"), _transformer(world / "base")
    # Two iterations feed the float-order differences of the sharded reductions back through the rollouts, and
    # AdamW's normalised step magnifies them where a gradient is near its epsilon: a wider band than one step's.
    for key in single:
        torch.testing.assert_close(cut[key], single[key], rtol=0, atol=STAGE_ATOL)
    assert max((single[k] - initial[k]).abs().max().item() for k in single) > 20 * STAGE_ATOL
    final_one, final_two = one.evaluations[-1], summary["evaluations"][-1]
    assert final_two["iteration"] == final_one["iteration"] == 2
    assert final_two["per_prompt"]["credited"] == final_one["per_prompt"]["credited"]  # every rank evaluated alike
    assert final_two["rewards"]["geneval"]["mean"] == pytest.approx(final_one["rewards"]["geneval"]["mean"], abs=1e-6)


# --- sharded checkpoints in one process ----------------------------------------------------------------------------


def _trained_state(seed: int) -> Checkpointed:
    """A full fine-tune of the tiny transformer one AdamW step in (from ``seed``'s input), with a snapshot."""
    config = make_config({"name": "diffusion_nft", "n_mc": 2}, lora=None, distributed={"strategy": "fsdp"})
    policy = make_policy(config)
    optimizer = build_optimizer(policy, config.optim)
    snapshots = {"old": ParameterSnapshot(trainable_parameters(policy))}
    g = torch.Generator().manual_seed(seed)
    policy(torch.randn(2, *TINY_LATENT_SHAPE, generator=g), torch.rand(2, generator=g), tiny_conditioning(2)).pow(
        2
    ).mean().backward()
    optimizer.step()
    return Checkpointed(policy, optimizer, snapshots)


def _state(iteration: int) -> TrainingState:
    return TrainingState(iteration=iteration, init_lora="None", history=(), evaluations=())


def _save(path: Path, seed: int = 0) -> torch.nn.Module:
    live = _trained_state(seed)
    save_sharded_state(path, live, _state(seed).to_json(), Distributed())
    return live.module


def test_a_sharded_checkpoint_round_trips_and_loads_no_pickle(tmp_path, monkeypatch):
    saved = _save(tmp_path / "iter-1", seed=1)
    files = sorted(p.relative_to(tmp_path / "iter-1").as_posix() for p in (tmp_path / "iter-1").rglob("*"))
    assert files == [
        "manifest.json",
        "optimizer.json",
        "shards",
        "shards/shard-00001-model-00001-of-00001.safetensors",
        "state.json",
    ]
    live = _trained_state(seed=2)  # other weights, moments and snapshot

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("unpickled")

    for owner, name in ((pickle, "load"), (pickle, "loads"), (torch, "load")):  # what DCP's pickled paths call
        monkeypatch.setattr(owner, name, refuse)
    assert load_sharded_state(tmp_path / "iter-1", live, Distributed()) == _state(1).to_json()
    for (name, p), q in zip(live.module.named_parameters(), saved.parameters(), strict=True):
        assert torch.equal(p, q), name
    expected = _trained_state(1).snapshots["old"].values
    assert all(torch.equal(v, e) for v, e in zip(live.snapshots["old"].values, expected, strict=True))
    assert int(next(iter(live.optimizer.state.values()))["step"]) == 1


def test_a_corrupt_sharded_checkpoint_is_set_aside_and_an_older_one_resumed(tmp_path, caplog):
    _save(tmp_path / "iter-1", seed=1)
    _save(tmp_path / "iter-2", seed=2)
    shard = next((tmp_path / "iter-2" / "shards").iterdir())
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit in a weight: safetensors itself would load it
    shard.write_bytes(bytes(data))
    live = _trained_state(seed=3)
    before = [p.detach().clone() for p in live.module.parameters()]
    with pytest.raises(CheckpointError, match=r"iter-2: checksum mismatch in .*shard-00001"):
        load_sharded_state(tmp_path / "iter-2", live, Distributed())
    assert all(torch.equal(p, b) for p, b in zip(live.module.parameters(), before, strict=True))  # untouched
    run = ResumableRun(tmp_path, "", None, keep=2, sharded=True)
    run.owns = lambda checkpoint: True
    with caplog.at_level(logging.WARNING, logger="vgrpo"):
        state = run.restore(live, Distributed())
    assert f"the stage resumes from the older checkpoint {tmp_path / 'iter-1'} (iteration 1)" in caplog.text
    assert state == _state(1)
    assert (tmp_path / ".corrupt-iter-2").is_dir()
