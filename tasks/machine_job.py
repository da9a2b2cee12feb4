"""What machine r > 0 of a stage that spans machines needs to start its processes (:mod:`tasks.stage_machine`): a
:class:`MachineJob`, written by machine 0's launch (:mod:`tasks.launch`) or by a scheduler's machine
(:mod:`tasks.cluster_stage`), and crossing to the other machines as JSON (a Prefect flow run's parameter, or a
file): :meth:`MachineJob.to_json`, :meth:`MachineJob.from_json`."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tasks.stage_layout import checked_relative
from tasks.stage_store import project_path
from vgrpo.config import StageConfig
from vgrpo.errors import ConfigError

__all__ = ["MachineJob", "this_machine"]


def this_machine(root: str) -> str:
    """This machine and checkout (host name and project root): what tells machine r that it landed on the worker
    machine 0 runs on."""
    return f"{socket.gethostname()}:{Path(root).resolve()}"


@dataclass(frozen=True)
class MachineJob:
    """A stage's params, its run folder and starting adapter relative to the project root (the same on every
    machine, with the adapter's hash, to restore it from the store), the machine that runs machine 0 (None: a
    scheduler's, which never shares a host) and the rendezvous (``main_ip``, ``main_port``; None: the accelerate
    config's).

    Checked once, here: ``run_root`` and ``init_lora`` are relative paths without ``..`` (the other machines
    replace and delete under them: inside their checkout); a :class:`ConfigError` names the key."""

    stage: StageConfig
    run_root: str
    init_lora: str | None = None
    init_hash: str | None = None
    machine_0: str | None = None
    main_ip: str | None = None
    main_port: int | None = None

    def __post_init__(self) -> None:
        checked_relative("machine job run_root", self.run_root)
        if self.init_lora:
            checked_relative("machine job init_lora", self.init_lora)

    @classmethod
    def from_this_machine(
        cls,
        cfg: StageConfig,
        init_lora: str | None,
        init_hash: str | None,
        run_root: str,
        root: str,
        main_ip: str | None,
        main_port: int | None,
    ) -> MachineJob:
        """The job of a stage whose machine 0 runs here, in the project at ``root``.

        Raises:
            ConfigError: ``run_root`` or ``init_lora`` lies outside the project root.
        """
        return cls(
            stage=cfg,
            run_root=project_path(run_root, root),
            init_lora=project_path(init_lora, root) if init_lora else None,
            init_hash=init_hash,
            machine_0=this_machine(root),
            main_ip=main_ip,
            main_port=main_port,
        )

    def to_json(self) -> dict[str, Any]:
        """The job as JSON: what a Prefect parameter or the job file holds."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**out, "stage": self.stage.model_dump(mode="json")}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MachineJob:
        """The job :meth:`to_json` wrote, validated (the stage's params as :class:`StageConfig` validates them).

        Raises:
            ConfigError: a key missing or unknown, or a path outside the checkout.
            pydantic.ValidationError: the stage's params.
        """
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        missing = [key for key in ("stage", "run_root") if key not in data]
        if unknown or missing:
            raise ConfigError(f"machine job: unknown keys {unknown}" if unknown else f"machine job: no {missing}")
        return cls(**{**data, "stage": StageConfig.model_validate(data["stage"])})
