"""Config of how a stage is launched: the ``launch:`` section of a stage's params, read by the Prefect train task and
DVC's stage command (``tasks/launch.py``), which start ``accelerate launch`` when it asks for more than one process
and train in their own process otherwise."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from vgrpo.config_base import MAX_PROCESSES, FrozenConfig
from vgrpo.config_batch import check_batch

__all__ = ["LaunchConfig", "processes_per_machine"]


def processes_per_machine(processes: int, machines: int) -> int:
    """The processes each machine runs: ``accelerate launch --num_processes N --num_machines M`` starts ``N // M`` on
    each (torchrun's ``--nproc_per_node``), and :class:`LaunchConfig` takes only counts that split evenly. A count
    that does not (a world size the preflight is given) is rounded up: the busiest machine's."""
    return -(-processes // machines)


class LaunchConfig(FrozenConfig):
    """The processes that share each iteration's batch (:mod:`vgrpo.parallel.distributed`): ``accelerate launch``'s
    ``--num_processes``, ``--num_machines``, ``--mixed_precision`` and ``--config_file``."""

    processes: int = Field(
        1,
        ge=1,
        le=MAX_PROCESSES,
        description="Processes over all machines (one per GPU); 1 = train in the calling process.",
    )
    machines: int = Field(
        1, ge=1, le=MAX_PROCESSES, description="Machines the processes are spread over (each runs processes/machines)."
    )
    mixed_precision: Literal["no", "bf16", "fp16"] = Field(
        "no",
        description="accelerate's mixed precision, for what an Accelerator prepares; the transformer's autocast is "
        "precision.autocast, which it must agree with.",
    )
    accelerate_config: str | None = Field(
        None,
        description="An accelerate config file (relative to the project root): the main machine's address and "
        "port, FSDP's settings; processes, machines and mixed_precision above override its own.",
    )

    @model_validator(mode="after")
    def _check_launch(self) -> LaunchConfig:
        if self.processes % self.machines:
            raise ValueError(
                f"launch.processes={self.processes} must split evenly over launch.machines={self.machines}"
            )
        if self.machines > 1 and self.accelerate_config is None:
            raise ValueError(
                f"launch.machines={self.machines} needs launch.accelerate_config, a file naming the main machine's "
                "address (main_process_ip) and port that the other machines reach"
            )
        return self

    def check_fits(self, *, autocast: str, prompts_per_iteration: int, group_size: int, minibatches: int) -> None:
        """Check that the stage's batch splits over the processes and that the mixed precision agrees with the
        stage's autocast (an Accelerator's cast and the transformer's own would otherwise differ).

        Raises:
            ValueError: naming the setting to change.
        """
        check_batch(prompts_per_iteration, group_size, minibatches, self.processes)
        if self.mixed_precision != "no" and self.mixed_precision != autocast:
            raise ValueError(
                f"launch.mixed_precision={self.mixed_precision} differs from precision.autocast={autocast}: set "
                "launch.mixed_precision to 'no' or to the autocast (the transformer has no fp16 autocast)"
            )

    @property
    def processes_per_machine(self) -> int:
        """The processes each machine runs (:func:`processes_per_machine`), one per device."""
        return processes_per_machine(self.processes, self.machines)

    @property
    def launched(self) -> bool:
        """Whether the stage runs under ``accelerate launch`` (more than one process)."""
        return self.processes > 1
