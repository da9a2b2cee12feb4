"""Sharded training: the helpers in one process, and two gloo processes (``accelerate launch``) against one
process with the whole batch on the tiny SD3 transformer with LoRA."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file

from tests.algorithms.helpers import make_config, make_policy
from tests.distributed_worker import CASES, run_case
from tests.tiny_world import run_whole_and_killed
from vgrpo.pairs import draw_pairs
from vgrpo.parallel.distributed import Distributed

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_TIMEOUT_S = 300
# float32 sums in another order (the ranks' gradients averaged, micro-batches cut elsewhere) change gradients by
# ~1e-7 relative; Adam's g / sqrt(v) magnifies that for elements whose gradient is tiny. Measured after two steps
# at lr 1e-2 (a move of ~2e-2): at most 5e-8 with one thread, 1.9e-6 with the test process's thread count.
PARAM_ATOL = 1e-5
# The resumed stage adds a process boundary: its ranks' kernels see other memory alignments than the one-process
# reference, whose last bits then differ by CPU (docs/development.md, "Tolerances"); two steps at lr 1e-2 move a weight
# by ~1e-2, which a sharding or resume bug would change.
RESUME_ATOL = 1e-4


def test_distributed_default_is_one_process_and_every_operation_the_identity():
    dist = Distributed()
    x = torch.arange(6.0)
    assert (dist.rank, dist.world_size, dist.is_main) == (0, 1, True)
    assert dist.shard(5) == slice(0, 5)
    assert dist.gather(x) is x and dist.broadcast(x) is x
    assert dist.reduce_metrics({"ratio_min": 0.5, "loss": 2.0}) == {"ratio_min": 0.5, "loss": 2.0}
    g = torch.Generator().manual_seed(0)
    assert dist.local_generator(g) is g


def test_shard_gives_each_rank_a_contiguous_block_and_names_the_setting_when_uneven():
    blocks = [Distributed.__new__(Distributed) for _ in range(4)]
    for rank, d in enumerate(blocks):
        d.rank, d.world_size = rank, 4
    assert [d.shard(8) for d in blocks] == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]
    with pytest.raises(ValueError, match=r"rollout.prompts_per_iteration=6 must be divisible by the 4 processes"):
        blocks[1].shard(6)


def test_local_generator_keeps_the_shared_stream_aligned_and_differs_between_ranks():
    ranks = [Distributed.__new__(Distributed) for _ in range(2)]
    for rank, d in enumerate(ranks):
        d.rank, d.world_size = rank, 2
    shared = [torch.Generator().manual_seed(3) for _ in ranks]
    local = [d.local_generator(g) for d, g in zip(ranks, shared, strict=True)]
    assert torch.equal(torch.rand(3, generator=shared[0]), torch.rand(3, generator=shared[1]))
    assert not torch.equal(torch.rand(3, generator=local[0]), torch.rand(3, generator=local[1]))


@pytest.mark.parametrize("share", ["batch", "group", "none"])
def test_shared_pairs_select_gives_a_block_the_rows_of_the_global_batch(share):
    g = torch.Generator().manual_seed(0)
    pairs = draw_pairs(
        num_prompts=4,
        group_size=3,
        n_mc=2,
        latent_shape=(2,),
        share=share,
        timestep_sampling="uniform",
        sigmas=torch.linspace(1, 0, 7),
        generator=g,
    )
    block = pairs.select(6, 6)  # samples 6..11 = prompts 2 and 3
    local = torch.arange(6)
    for j in range(2):
        assert torch.equal(block.timesteps(j, local), pairs.timesteps(j, local + 6))
        assert torch.equal(block.noise(j, local), pairs.noise(j, local + 6))
    assert block.t.shape[0] == {"batch": 1, "group": 2, "none": 6}[share]
    with pytest.raises(ValueError, match="not whole groups of 3"):
        pairs.select(4, 6)


# --- two processes ----------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch_two_processes(module_args: list[str]) -> str:
    """``accelerate launch`` with two gloo processes (configs/accelerate/cpu_2proc.yaml) in its own process group,
    killed whole on timeout; returns the combined log after asserting a zero exit."""
    config = ROOT / "configs/accelerate/cpu_2proc.yaml"
    cmd = [
        str(Path(sys.executable).with_name("accelerate")),
        "launch",
        "--config_file",
        str(config),
        "--main_process_port",
        str(_free_port()),
        *module_args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        log, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"accelerate launch did not finish in {LAUNCH_TIMEOUT_S} s")
    assert proc.returncode == 0, log[-4000:]
    return log


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    """The worker under ``accelerate launch`` with two gloo processes, in its own process group (killed whole
    on timeout): ``(tensors, metrics)`` written by rank 0."""
    out = tmp_path_factory.mktemp("dist") / "two.safetensors"
    _launch_two_processes(["-m", "tests.distributed_worker", str(out)])
    with safe_open(str(out), "pt") as f:
        metadata = f.metadata()
    assert metadata["world_size"] == "2"
    return load_file(str(out)), json.loads(metadata["metrics"])


def _case(tensors, name):
    prefix = f"{name}/"
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


@pytest.mark.parametrize("name", ["vgrpo_batch", "vgrpo_none", "diffusion_nft"])
def test_two_processes_match_one_process_with_the_whole_batch(two_process_run, name):
    tensors, metrics = two_process_run
    two = _case(tensors, name)
    one, one_metrics = run_case(name, Distributed())
    one = _case(one, name)
    assert set(one) == set(two)
    # Same samples, rewards, advantages and pairs, bit for bit.
    for key in ("samples", "advantages", *(k for k in one if k.startswith("pairs_"))):
        assert torch.equal(one[key], two[key]), key
    assert two["param_rank_gap_max"].item() == 0.0  # every rank stepped the same averaged gradient
    old = "v_old" if name == "diffusion_nft" else "old_surrogates"
    torch.testing.assert_close(two[old], one[old], rtol=0, atol=1e-6)
    initial = dict(make_policy(make_config(CASES[name]["algorithm"])).named_parameters())
    moved = 0.0
    for key in (k for k in one if k.startswith("param.")):
        torch.testing.assert_close(two[key], one[key], rtol=0, atol=PARAM_ATOL)
        moved = max(moved, (one[key] - initial[key.removeprefix("param.")]).abs().max().item())
    assert moved > 100 * PARAM_ATOL  # the update is far larger than the tolerance
    assert set(metrics[name]) == set(one_metrics)
    for key, value in one_metrics.items():
        assert metrics[name][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_two_processes_flow_grpo_per_rank_sde_noise_and_minibatches_keep_ranks_in_step(two_process_run):
    tensors, _ = two_process_run
    two = _case(tensors, "flow_grpo")
    one = _case(run_case("flow_grpo", Distributed())[0], "flow_grpo")
    assert two["param_rank_gap_max"].item() == 0.0
    # Rank 0's SDE noise is its own stream's, so its samples are not the single process's (documented).
    assert not torch.equal(two["samples"][:6], one["samples"][:6])
    initial = dict(make_policy(make_config(CASES["flow_grpo"]["algorithm"])).named_parameters())
    assert any(not torch.equal(two[k], initial[k.removeprefix("param.")]) for k in two if k.startswith("param."))


# --- the train command ------------------------------------------------------------------------------------------


def _stage_params(world: Path, **overrides: object) -> Path:
    from tests.tiny_world import tiny_stage_config as _config

    path = world / f"stage-{len(list(world.glob('stage-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(_config(eval_prompts=None, **overrides).model_dump(mode="json")))
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny_world import write_tiny_world

    return write_tiny_world(tmp_path_factory.mktemp("world"))


def test_train_command_runs_a_stage_and_exits_2_on_params_that_do_not_shard(world, monkeypatch, capsys):
    from vgrpo.cli import main

    params = _stage_params(world, iterations=1)
    common = [
        "--root",
        str(world),
        "--pipeline",
        "base",
        "--work-dir",
        str(world / "work"),
        "--out",
        str(world / "lora"),
    ]
    metrics = world / "metrics.json"
    assert main(["train", "--params", str(params), *common, "--metrics", str(metrics)]) == 0
    assert (world / "lora" / "pytorch_lora_weights.safetensors").is_file()
    assert json.loads(metrics.read_text())["world_size"] == 1
    assert "tiny | iteration 1/1 | " in capsys.readouterr().err  # the progress line (off a terminal: on stderr)
    monkeypatch.setenv("WORLD_SIZE", "4")  # 2 prompts per iteration do not split over 4 processes
    assert main(["train", "--params", str(params), *common]) == 2
    assert "rollout.prompts_per_iteration=2 must be divisible by the 4 processes" in capsys.readouterr().err
    monkeypatch.delenv("WORLD_SIZE")
    assert main(["train", "--params", str(params), "--set", "rollout.nope=1", *common]) == 2


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch on one CPU thread, as each launched rank (``--threads 1``): the reference then sums in the ranks'
    order, and only the sharding is left to differ."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def test_two_process_stage_resumes_a_one_process_checkpoint_and_matches_one_process(world, one_thread):
    """``accelerate launch -m vgrpo.cli train`` on two gloo processes picks up the checkpoint a killed
    single-process run left after iteration 0, finishes on the ranks' halves of each batch (rank 0 writing the
    checkpoints and the adapter) and ends where one uninterrupted process ends."""
    from vgrpo.config import StageConfig

    rollout = {"prompts_per_iteration": 2, "group_size": 4, "num_steps": 4, "shift": None, "micro_batch_size": 4}
    params = _stage_params(world, iterations=2, rollout=rollout, optim={"lr": 1e-2, "micro_batch_size": 4})
    cfg = StageConfig.model_validate(yaml.safe_load(params.read_text()))
    run_whole_and_killed(cfg, world)
    metrics = world / "two.json"
    log = _launch_two_processes(
        [
            "-m",
            "vgrpo.cli",
            "train",
            "--params",
            str(params),
            "--root",
            str(world),
            "--pipeline",
            "base",
            "--work-dir",
            str(world / "cut"),
            "--out",
            str(world / "cut_lora"),
            "--metrics",
            str(metrics),
            "--threads",
            "1",
        ]
    )
    summary = json.loads(metrics.read_text())
    assert summary["world_size"] == 2 and summary["resumed_from"] == 1
    assert log.count("tiny | iteration 2/2 | ") == 1  # rank 0 alone shows the progress line
    assert sorted(p.name for p in (world / "cut" / "checkpoints").iterdir()) == ["iter-1", "iter-2"]
    a = load_file(world / "whole_lora" / "pytorch_lora_weights.safetensors")
    b = load_file(world / "cut_lora" / "pytorch_lora_weights.safetensors")
    assert set(a) == set(b)
    for key in a:  # one thread on both sides, so only the sharding and the process differ
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=RESUME_ATOL)


@pytest.mark.parametrize("name", ["single_gpu", "ddp_8gpu", "multinode_ddp", "cpu_2proc"])
def test_accelerate_configs_parse_and_the_sd35_batch_shards_over_their_processes(name):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(ROOT / "configs" / "accelerate" / f"{name}.yaml"))
    sd35 = yaml.safe_load((ROOT / "params" / "models" / "sd35.yaml").read_text())
    assert sd35["rollout"]["prompts_per_iteration"] % config.num_processes == 0
    assert config.num_processes % config.num_machines == 0
