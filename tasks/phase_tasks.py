"""Each phase of a stage as a Prefect task run: ``s2-geneval/rollout-0042``, ``s2-geneval/score-0042``, ...

:func:`vgrpo.training.stage.run_stage` calls its phases through a :class:`vgrpo.training.stage.PhaseRunner`; this
one runs each as a task of the current flow (nested under the stage's task), so the UI shows every step of every
iteration.
Tensors pass in memory between these tasks: nothing is cached or persisted (``NO_CACHE``, no result storage),
and the arguments go to the task quoted (``prefect.utilities.annotations.quote``), so Prefect neither
hashes nor walks them.

Only the score phase retries, and only on :class:`vgrpo.rewards.base.TransientRewardError` (a reward server
that was unreachable or overloaded): a NaN score, bad input or a bug fails at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from prefect import Task, task
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from vgrpo.rewards.base import TransientRewardError

__all__ = ["PrefectPhases", "is_transient"]

T = TypeVar("T")

RETRIES = {"score": 2}
RETRY_DELAY_S = 10.0


def _run(run_name: str, call: tuple[Callable[..., Any], tuple[Any, ...]]) -> Any:
    fn, args = call
    return fn(*args)


def is_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry condition: the failure is a :class:`TransientRewardError` (nothing else is worth a retry)."""
    try:
        state.result()
    except TransientRewardError:
        return True
    except BaseException:
        return False
    return False


class PrefectPhases:
    """A :class:`vgrpo.training.stage.PhaseRunner` that runs phase ``p`` of iteration ``i`` of stage ``s`` as the
    task run ``s/p-iiii`` (``s/p`` for once-per-stage phases)."""

    def __init__(self, stage: str):
        self.stage = stage
        self._tasks: dict[str, Task[..., Any]] = {}

    def _task(self, phase: str) -> Task[..., Any]:
        if phase not in self._tasks:
            retries = RETRIES.get(phase, 0)
            self._tasks[phase] = task(
                name=phase,
                task_run_name="{run_name}",
                cache_policy=NO_CACHE,
                persist_result=False,
                retries=retries,
                retry_delay_seconds=RETRY_DELAY_S,
                retry_condition_fn=is_transient if retries else None,
            )(_run)
        return self._tasks[phase]

    def __call__(self, phase: str, iteration: int | None, fn: Callable[..., T], /, *args: Any) -> T:
        name = f"{self.stage}/{phase}" if iteration is None else f"{self.stage}/{phase}-{iteration:04d}"
        # Quoted: Prefect would otherwise walk the live objects (an Evaluator is a dataclass holding every row).
        return cast(T, self._task(phase)(name, quote((fn, args))))
