"""FSDP (``distributed.strategy: fsdp``): two gloo processes with the tiny SD3 transformer sharded by torch's FSDP2
against one unsharded process, in full fine-tuning; the snapshots every algorithm keeps, on sharded weights; the
sharded checkpoints (no pickle, checked before loading) and the export of a whole pipeline."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.algorithms.helpers import make_config, make_policy
from tests.distributed_worker import FSDP_CASES, run_full_case
from tests.test_distributed import PARAM_ATOL, _case, _launch_two_processes
from vgrpo.distributed import Distributed
from vgrpo.errors import ConfigError


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
