"""Where a batch scheduler placed a stage's machines, read from the environment it gives each of them: Slurm's job
(one ``srun`` task per node) or the Kubeflow training operator's ``PyTorchJob`` (one pod per machine).

:func:`placement_from_env` turns either into a :class:`Placement`: how many machines, which one this is, how many
processes each runs (one per GPU) and the rendezvous every machine meets at, which are ``accelerate launch``'s
``--num_machines``, ``--machine_rank``, ``--num_processes`` and ``--main_process_ip/port``
(:mod:`tasks.cluster_stage` starts it with them, through :mod:`tasks.launch`).

Slurm (docs/cluster.md): machines ``SLURM_NNODES``, this one ``SLURM_NODEID``, processes ``SLURM_GPUS_ON_NODE``
per node, the rendezvous on the first host of ``SLURM_JOB_NODELIST`` (:func:`expand_nodelist`: no ``scontrol``
needed) at a port derived from ``SLURM_JOB_ID``, so every node computes the same one and a requeued job (same id)
meets at it again. ``VGRPO_MAIN_ADDR`` / ``VGRPO_MAIN_PORT`` replace them (a node name that resolves to the wrong
network; a port the site reserves).

Kubeflow's operator (``pkg/controller.v1/pytorch/envvar.go``, v1.7 to v1.9): ``PET_NNODES`` pods,
this one ``PET_NODE_RANK``, ``PET_NPROC_PER_NODE`` processes each, the rendezvous at ``PET_MASTER_ADDR:PORT``
(the master pod's service); older operators set only ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` (pods) and
``RANK`` (this pod), which are read when the ``PET_`` ones are absent.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vgrpo.errors import ConfigError

__all__ = [
    "DEFAULT_ACCELERATE_CONFIG",
    "Placement",
    "expand_nodelist",
    "launch_section",
    "placement_from_env",
    "pytorchjob_placement",
    "slurm_placement",
    "slurm_port",
    "without_rendezvous_variables",
]

DEFAULT_ACCELERATE_CONFIG = "configs/accelerate/multinode_ddp.yaml"
"""The accelerate config of a stage on several machines whose params name none: the placement's arguments replace
its machines, processes and rendezvous."""

SLURM_PORTS = (10000, 20000)
"""Slurm's rendezvous port is ``10000 + SLURM_JOB_ID % 20000``: below Linux's ephemeral range (32768 up), so no
client socket holds it, and distinct for jobs whose ids are closer than 20000 (two jobs sharing a node)."""

RENDEZVOUS_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
"""torch's own variables, which a scheduler may set for the machine: the launcher sets them per process."""

_BRACKETS = re.compile(r"\[([^\[\]]*)\]")


@dataclass(frozen=True)
class Placement:
    """This machine's place in a scheduled stage: ``accelerate launch``'s arguments."""

    scheduler: str  # "slurm" or "kubernetes"
    job: str  # Slurm's job id; the PyTorchJob's rendezvous host (its master's service)
    machines: int
    machine_rank: int
    processes_per_machine: int
    main_addr: str
    main_port: int

    @property
    def processes(self) -> int:
        """Processes over all machines."""
        return self.machines * self.processes_per_machine

    def describe(self) -> str:
        return (
            f"{self.scheduler} job {self.job}: machine {self.machine_rank} of {self.machines}, "
            f"{self.processes_per_machine} processes each, rendezvous {self.main_addr}:{self.main_port}"
        )


def _expand_range(part: str, nodelist: str) -> list[str]:
    """``01-03`` -> ``01 02 03`` (the width of the first bound, as Slurm pads); ``7`` -> ``7``."""
    lo, sep, hi = part.partition("-")
    if not lo.isdigit() or (sep and not hi.isdigit()):
        raise ConfigError(f"SLURM_JOB_NODELIST={nodelist}: {part!r} is not a number or a range a-b")
    if not sep:
        return [lo]
    if int(hi) < int(lo):
        raise ConfigError(f"SLURM_JOB_NODELIST={nodelist}: the range {part} runs backwards")
    return [str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1)]


def _split_top_level(nodelist: str) -> list[str]:
    """Split at the commas outside brackets: ``a[1,3],b`` -> ``a[1,3]``, ``b``."""
    entries, depth, start = [], 0, 0
    for i, char in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ConfigError(f"SLURM_JOB_NODELIST={nodelist}: unbalanced or nested brackets")
        if char == "," and depth == 0:
            entries.append(nodelist[start:i])
            start = i + 1
    if depth:
        raise ConfigError(f"SLURM_JOB_NODELIST={nodelist}: unbalanced brackets")
    return [*entries, nodelist[start:]]


def expand_nodelist(nodelist: str) -> list[str]:
    """The host names of a Slurm node list in its order, as ``scontrol show hostnames`` prints them:
    ``gpu[01-04,07]`` -> gpu01 gpu02 gpu03 gpu04 gpu07; ``a[1-2]-ib,b3`` -> a1-ib a2-ib b3; several bracket groups
    in one name expand as their product (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2).

    Raises:
        ConfigError: an empty list, an empty name, unbalanced brackets or a range that is not ``a-b``.
    """
    hosts: list[str] = []
    for entry in _split_top_level(nodelist.strip()):
        if not entry:
            raise ConfigError(f"SLURM_JOB_NODELIST={nodelist!r}: an empty host name")
        texts = _BRACKETS.split(entry)  # fixed text, range list, fixed text, ...
        choices = [
            [text] if i % 2 == 0 else [n for part in text.split(",") for n in _expand_range(part, nodelist)]
            for i, text in enumerate(texts)
        ]
        hosts += ["".join(parts) for parts in itertools.product(*choices)]
    return hosts


def _integer(env: Mapping[str, str], name: str, default: int | None = None, low: int = 0) -> int:
    value = env.get(name, "").strip()
    if not value:
        if default is None:
            raise ConfigError(f"{name} is not set: is this running inside the scheduler's job (srun, a pod)?")
        return default
    if not value.isdigit() or int(value) < low:
        raise ConfigError(f"{name}={value}: expected an integer >= {low}")
    return int(value)


def slurm_port(job_id: int) -> int:
    """The rendezvous port of Slurm job ``job_id`` (:data:`SLURM_PORTS`)."""
    base, span = SLURM_PORTS
    return base + job_id % span


def _gpu_count(requested: str, gpus: int, name: str) -> int:
    """Processes per machine: a number, or ``gpu``/``auto`` for the GPUs this machine sees (one process without)."""
    if requested.isdigit() and int(requested) > 0:
        return int(requested)
    if requested in ("", "gpu", "auto"):
        return max(gpus, 1)
    raise ConfigError(f"{name}={requested}: give the processes per machine, one per GPU (a number, or 'gpu')")


def slurm_placement(env: Mapping[str, str], gpus: int = 0) -> Placement:
    """The placement of this ``srun`` task (one per node) in Slurm job ``env``; ``gpus``: the GPUs this process
    sees, used when Slurm does not say (``SLURM_GPUS_ON_NODE`` unset)."""
    job = _integer(env, "SLURM_JOB_ID")
    machines = _integer(env, "SLURM_NNODES" if env.get("SLURM_NNODES") else "SLURM_JOB_NUM_NODES", low=1)
    rank = _integer(env, "SLURM_NODEID")
    if "SLURM_PROCID" in env and _integer(env, "SLURM_PROCID") != rank:
        raise ConfigError(
            f"SLURM_PROCID={env['SLURM_PROCID']} differs from SLURM_NODEID={rank}: start one task per node "
            "(srun --ntasks-per-node=1); accelerate starts each node's processes"
        )
    if not rank < machines:
        raise ConfigError(f"SLURM_NODEID={rank} is not one of the job's {machines} nodes")
    hosts = expand_nodelist(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
    if len(hosts) != machines:
        raise ConfigError(f"SLURM_JOB_NODELIST names {len(hosts)} hosts, SLURM_NNODES={machines}")
    per_machine = _gpu_count(env.get("SLURM_GPUS_ON_NODE", "").strip(), gpus, "SLURM_GPUS_ON_NODE")
    return Placement(
        scheduler="slurm",
        job=str(job),
        machines=machines,
        machine_rank=rank,
        processes_per_machine=per_machine,
        main_addr=env.get("VGRPO_MAIN_ADDR") or hosts[0],
        main_port=_integer(env, "VGRPO_MAIN_PORT", slurm_port(job), low=1),
    )


def pytorchjob_placement(env: Mapping[str, str], gpus: int = 0) -> Placement:
    """The placement of this pod of a ``PyTorchJob`` (the operator's variables in ``env``); ``gpus``: the GPUs this
    pod sees, for ``nprocPerNode: gpu`` or ``auto`` (or none given)."""
    nodes = env.get("PET_NNODES", "").strip()
    if ":" in nodes:
        raise ConfigError(
            f"PET_NNODES={nodes}: an elasticPolicy's range of machines; a stage runs on fixed machines (its batch "
            "split and a resumed stage's result depend on them): remove elasticPolicy"
        )
    pet = bool(nodes)
    machines = _integer(env, "PET_NNODES" if pet else "WORLD_SIZE", low=1)
    rank = _integer(env, "PET_NODE_RANK" if pet else "RANK")
    if not rank < machines:
        raise ConfigError(f"node rank {rank} is not one of the job's {machines} pods")
    main_addr = env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR")
    if not main_addr:
        raise ConfigError("MASTER_ADDR is not set: run this in a PyTorchJob with a Master replica")
    port_name = "PET_MASTER_PORT" if env.get("PET_MASTER_PORT") else "MASTER_PORT"
    return Placement(
        scheduler="kubernetes",
        job=main_addr,
        machines=machines,
        machine_rank=rank,
        processes_per_machine=_gpu_count(env.get("PET_NPROC_PER_NODE", "").strip(), gpus, "PET_NPROC_PER_NODE"),
        main_addr=main_addr,
        main_port=_integer(env, port_name, low=1),
    )


def placement_from_env(env: Mapping[str, str], gpus: int = 0) -> Placement:
    """This machine's placement from whichever scheduler set ``env``: Slurm (``SLURM_JOB_ID``) or a PyTorchJob
    (``PET_NNODES``, or ``MASTER_ADDR`` with ``WORLD_SIZE``).

    Raises:
        ConfigError: neither, or a variable the mapping needs is missing or malformed (named).
    """
    if env.get("SLURM_JOB_ID"):
        return slurm_placement(env, gpus)
    if env.get("PET_NNODES") or (env.get("MASTER_ADDR") and env.get("WORLD_SIZE")):
        return pytorchjob_placement(env, gpus)
    raise ConfigError(
        "no scheduler's job here: run this under srun in a Slurm job (scripts/slurm/stage.sbatch) or as a "
        "PyTorchJob's pod (deploy/kubernetes/stage.pytorchjob.yaml); on one machine use tasks.dvc_stage"
    )


def launch_section(stage_launch: Mapping[str, Any], placement: Placement) -> dict[str, Any]:
    """A stage's ``launch:`` params on ``placement``: its machines and processes are the scheduler's; its accelerate
    config is kept (:data:`DEFAULT_ACCELERATE_CONFIG` when it names none) and its mixed precision too."""
    config = stage_launch.get("accelerate_config") or (DEFAULT_ACCELERATE_CONFIG if placement.machines > 1 else None)
    return {
        **stage_launch,
        "processes": placement.processes,
        "machines": placement.machines,
        "accelerate_config": config,
    }


def without_rendezvous_variables(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the machine-level rendezvous a scheduler set (:data:`RENDEZVOUS_VARIABLES`, torchrun's
    ``PET_*`` defaults): torchrun sets each process's own, and a leftover ``WORLD_SIZE`` would make this machine's
    launcher process (which evaluates the stage after training) think it is one rank of many."""
    return {k: v for k, v in env.items() if k not in RENDEZVOUS_VARIABLES and not k.startswith("PET_")}
