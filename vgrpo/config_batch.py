"""The one check that an iteration's batch splits: ``rollout.prompts_per_iteration x rollout.group_size`` samples
into whole prompt groups over the processes, and each process's samples into ``optim.minibatches``.

Every place that needs the batch to split calls :func:`check_batch` -- the stage config at load time (one process,
then ``launch.processes``), :func:`vgrpo.config.load_stage` (the processes started), the preflight, the stage before
it loads anything, each rollout and :meth:`vgrpo.parallel.distributed.Distributed.shard` -- so its error names
the same key and numbers wherever it is raised.
"""

from __future__ import annotations

__all__ = ["check_batch"]


def check_batch(prompts_per_iteration: int, group_size: int = 1, minibatches: int = 1, processes: int = 1) -> int:
    """The samples each of ``processes`` processes holds when the ``prompts_per_iteration x group_size`` batch is
    split into whole prompt groups, checked to split further into ``minibatches``.

    Raises:
        ValueError: naming ``rollout.prompts_per_iteration`` when the prompts do not split evenly over the
            processes, or ``optim.minibatches`` when it does not divide the batch (one process) or a process's
            samples, with the numbers.
    """
    if prompts_per_iteration % processes:
        raise ValueError(
            f"rollout.prompts_per_iteration={prompts_per_iteration} must be divisible by the {processes} processes"
        )
    samples = prompts_per_iteration // processes * group_size
    if samples % minibatches:
        if processes == 1:
            raise ValueError(
                f"optim.minibatches={minibatches} must divide the batch "
                f"(rollout.prompts_per_iteration x rollout.group_size = {samples})"
            )
        raise ValueError(
            f"optim.minibatches={minibatches} must divide each of the {processes} processes' {samples} samples "
            "(rollout.prompts_per_iteration x rollout.group_size / processes)"
        )
    return samples
