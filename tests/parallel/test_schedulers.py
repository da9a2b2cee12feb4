"""A scheduler's environment -> the stage's launch arguments (vgrpo/parallel/schedulers.py): Slurm's compressed node
lists expanded as ``scontrol show hostnames`` does, Slurm's and the Kubeflow operator's variables mapped to the
machines, this machine's rank, its processes and the rendezvous, and the refusals that name the variable."""

from __future__ import annotations

import pytest

from vgrpo.errors import ConfigError
from vgrpo.parallel.launch import LaunchConfig
from vgrpo.parallel.schedulers import (
    DEFAULT_ACCELERATE_CONFIG,
    Placement,
    expand_nodelist,
    launch_section,
    placement_from_env,
    slurm_port,
    without_rendezvous_variables,
)


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("gpu01", ["gpu01"]),
        ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
        ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
        ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
        ("a[1-2]-ib,b3,c[5]", ["a1-ib", "a2-ib", "b3", "c5"]),
        ("r[1-2]n[1,3]", ["r1n1", "r1n3", "r2n1", "r2n3"]),
        ("127.0.0.[1-2]", ["127.0.0.1", "127.0.0.2"]),
        ("node-[009-011],login", ["node-009", "node-010", "node-011", "login"]),
    ],
)
def test_a_nodelist_expands_as_scontrol_show_hostnames(nodelist: str, hosts: list[str]) -> None:
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist", ["", "gpu[01-04", "gpu01-04]", "gpu[[1]]", "gpu[4-1]", "gpu[a-b]", "a,,b"])
def test_a_malformed_nodelist_is_refused_by_name(nodelist: str) -> None:
    with pytest.raises(ConfigError, match="SLURM_JOB_NODELIST"):
        expand_nodelist(nodelist)


SLURM = {"SLURM_JOB_ID": "81234", "SLURM_JOB_NODELIST": "gpu[03-04]", "SLURM_NNODES": "2", "SLURM_GPUS_ON_NODE": "8"}


def test_slurm_gives_the_machines_the_rank_the_gpus_and_the_first_host() -> None:
    node = {**SLURM, "SLURM_NODEID": "1", "SLURM_PROCID": "1", "SLURMD_NODENAME": "gpu04"}
    assert placement_from_env(node) == Placement("slurm", "81234", 2, 1, 8, "gpu03", 10000 + 81234 % 20000)
    assert placement_from_env(node).processes == 16
    assert 10000 <= slurm_port(2**40 + 7) < 30000  # below Linux's ephemeral ports, whatever the id


def test_slurm_without_gpus_runs_one_process_per_node_or_the_gpus_it_sees() -> None:
    node = {k: v for k, v in SLURM.items() if k != "SLURM_GPUS_ON_NODE"} | {"SLURM_NODEID": "0"}
    assert placement_from_env(node).processes_per_machine == 1
    assert placement_from_env(node, gpus=4).processes_per_machine == 4


def test_slurm_overrides_and_the_job_level_node_count() -> None:
    node = {k: v for k, v in SLURM.items() if k != "SLURM_NNODES"}
    node |= {"SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "0", "VGRPO_MAIN_ADDR": "gpu03-ib", "VGRPO_MAIN_PORT": "2999"}
    placed = placement_from_env(node)
    assert (placed.machines, placed.main_addr, placed.main_port) == (2, "gpu03-ib", 2999)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"SLURM_PROCID": "3"}, "ntasks-per-node=1"),  # several tasks per node
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2"),
        ({"SLURM_NNODES": "3"}, "names 2 hosts"),
        ({"SLURM_GPUS_ON_NODE": "cpu"}, "SLURM_GPUS_ON_NODE"),
        ({"SLURM_NNODES": "two"}, "SLURM_NNODES=two"),
        ({"VGRPO_MAIN_PORT": "0"}, "VGRPO_MAIN_PORT"),
    ],
)
def test_a_slurm_environment_that_does_not_fit_is_refused_by_name(change: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        placement_from_env({**SLURM, "SLURM_NODEID": "1", **change})


def operator_env(rank: int, replicas: int = 2, nproc: str | None = "4") -> dict[str, str]:
    """What training-operator v1.9 sets in pod ``rank`` (0: the master) of a PyTorchJob (envvar.go, master.go)."""
    env = {
        "MASTER_ADDR": "stage-master-0",
        "MASTER_PORT": "23456",
        "PET_MASTER_ADDR": "stage-master-0",
        "PET_MASTER_PORT": "23456",
        "WORLD_SIZE": str(replicas * (int(nproc) if nproc and nproc.isdigit() else 1)),
        "RANK": str(rank),
        "PET_NODE_RANK": str(rank),
        "PET_NNODES": str(replicas),
        "PYTHONUNBUFFERED": "1",
    }
    return env | ({"PET_NPROC_PER_NODE": nproc} if nproc is not None else {})


def test_the_operators_variables_give_the_pods_rank_and_the_masters_service() -> None:
    master = "stage-master-0"
    assert placement_from_env(operator_env(1)) == Placement("kubernetes", master, 2, 1, 4, master, 23456)
    assert placement_from_env(operator_env(0, nproc="gpu"), gpus=8).processes == 16
    assert placement_from_env(operator_env(0, nproc=None)).processes_per_machine == 1  # no GPU here


def test_an_operator_before_the_pet_variables_gives_pods_as_world_size() -> None:
    old = {"MASTER_ADDR": "stage-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2"}
    assert placement_from_env(old, gpus=2) == Placement(
        "kubernetes", old["MASTER_ADDR"], 3, 2, 2, old["MASTER_ADDR"], 23456
    )


def test_an_elastic_job_and_no_scheduler_are_refused() -> None:
    with pytest.raises(ConfigError, match="elasticPolicy"):
        placement_from_env(operator_env(0) | {"PET_NNODES": "1:4"})
    with pytest.raises(ConfigError, match="no scheduler"):
        placement_from_env({"HOME": "/root"})


def test_the_launch_section_takes_the_placement_and_keeps_the_rest() -> None:
    placed = Placement("slurm", "7", 2, 0, 8, "gpu01", 10007)
    section = launch_section(LaunchConfig(mixed_precision="bf16").model_dump(), placed)
    launch = LaunchConfig.model_validate(section)
    assert (launch.processes, launch.machines, launch.mixed_precision) == (16, 2, "bf16")
    assert launch.accelerate_config == DEFAULT_ACCELERATE_CONFIG
    own = launch_section({"accelerate_config": "configs/accelerate/fsdp.yaml"}, placed)
    assert own["accelerate_config"] == "configs/accelerate/fsdp.yaml"
    one = launch_section({}, Placement("slurm", "7", 1, 0, 4, "gpu01", 10007))
    assert LaunchConfig.model_validate(one).accelerate_config is None  # one machine: a free port, no config


def test_the_machines_rendezvous_variables_do_not_reach_the_launcher() -> None:
    kept = without_rendezvous_variables(operator_env(1) | {"LOCAL_RANK": "0", "SLURM_JOB_ID": "1", "PATH": "/bin"})
    assert kept == {"PYTHONUNBUFFERED": "1", "SLURM_JOB_ID": "1", "PATH": "/bin"}
