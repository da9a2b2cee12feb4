"""The Prefect tasks of a curriculum stage, around the plain bodies of :mod:`tasks.stage`:

* ``prepare-prompts``: the stage's prompt rows, cached on the prompt files' bytes and the filters.
* ``train-stage``: :func:`tasks.stage.train` with each phase as its own task run (:mod:`tasks.phase_tasks`).
  Cached on the training fingerprint (never the evaluation settings nor ``launch``), the starting adapter's
  hash, the run folder and the code; the flow refreshes the cache when the stage's output is gone or changed
  (:func:`tasks.stage.output_is_intact`). A resumed stage continues the MLflow run its checkpoint names.
* ``evaluate``: :func:`tasks.stage.evaluate` of the exported adapter, cached on the adapter's hash and the
  evaluation settings: changing an evaluation setting re-evaluates and never retrains.

Every task takes the stage's validated :class:`vgrpo.config.StageConfig`: the flow validates each stage once,
when it loads the curriculum.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect import Task, get_run_logger, task
from prefect.client.schemas.objects import State, TaskRun
from prefect.context import TaskRunContext
from prefect.deployments import run_deployment
from prefect.runtime import deployment, flow_run

from tasks.launch import MachinesLaunchFailed
from tasks.machine_job import MachineJob
from tasks.outcome import StageEvaluation, StageOutcome
from tasks.phase_tasks import PrefectPhases
from tasks.stage import code_version, evaluate, grid_path, output_is_intact, train
from tasks.stage_layout import MANIFEST, stage_dirs
from tasks.stage_store import publish_outcome, published_outcome
from tasks.store import Store
from tasks.tracking import Tracking
from vgrpo.checkpoints.resume import training_hash
from vgrpo.config import StageConfig
from vgrpo.training.prompt_rows import StagePrompts, prepare_prompts

__all__ = ["MACHINE_DEPLOYMENT", "evaluate_task", "prepare_prompts_task", "submit_machines", "train_task"]

MACHINE_DEPLOYMENT = "vgrpo-machine/stage-machine"
"""The deployment that runs machine r > 0 of a stage spanning machines (:mod:`flows.machine`)."""


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _file_hash(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else None


def _prompts_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    cfg: StageConfig = parameters["stage"]
    root = Path(parameters["root"])
    files = [cfg.prompts, cfg.eval_prompts]
    selection = cfg.model_dump(mode="json", include={"prompt_tags", "prompt_tag_weights", "rewards"})
    selection["evaluation"] = cfg.evaluation.model_dump(mode="json", include={"max_prompts", "rewards"})
    hashes = [_file_hash(root / f) if f else None for f in files]
    return "prompts-" + _digest(files, hashes, selection, code_version())


@task(
    name="prepare-prompts",
    cache_key_fn=_prompts_key,
    persist_result=True,
    task_run_name="{stage.name}/prepare-prompts",
)
def prepare_prompts_task(stage: StageConfig, root: str) -> StagePrompts:
    """The stage's training and evaluation prompt rows (:func:`vgrpo.training.prompt_rows.prepare_prompts`)."""
    return prepare_prompts(stage, Path(root))


def _train_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    fingerprint = training_hash(parameters["stage"])
    return "train-stage-" + _digest(fingerprint, parameters["init_hash"], parameters["run_root"], code_version())


def submit_machines(job: MachineJob, ranks: Sequence[int]) -> None:
    """Machines ``ranks`` of a stage that spans machines, each a flow run of :data:`MACHINE_DEPLOYMENT` (the job as
    JSON: :func:`flows.machine.stage_machine_flow`): the pool's free workers take them."""
    job_json = job.to_json()
    for rank in ranks:
        name = f"{job.stage.name}/machine-{rank}"
        parameters = {"job": job_json, "machine_rank": rank}
        run_deployment(MACHINE_DEPLOYMENT, parameters=parameters, timeout=0, flow_run_name=name)


def _lost_a_machine(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Whether the stage failed because it spans machines and one of them (or the network) was lost."""
    try:
        state.result()
    except MachinesLaunchFailed:
        return True
    except Exception:
        return False
    return False


@task(
    name="train-stage",
    cache_key_fn=_train_key,
    persist_result=True,
    retries=2,
    retry_condition_fn=_lost_a_machine,
    task_run_name="{stage.name}/train",
)
def train_task(
    stage: StageConfig,
    init_lora: str | None,
    init_hash: str | None,
    run_root: str,
    root: str = ".",
    tracking: Tracking | None = None,
    prompts: StagePrompts | None = None,
) -> StageOutcome:
    """Train one stage, each phase a task run (a launched stage: the processes' rank-0 output in this task's
    log); ``init_hash`` (the previous adapter's :func:`tasks.stage.dir_hash`) is read only by the cache key.
    A stage spanning machines has its other machines started by the pool (:func:`submit_machines`) when this
    flow run came from a deployment, and is retried, from its checkpoints, when one of them is lost. No other
    retries: a failure inside a stage is a bug or bad input (transient reward faults are retried by the score
    phase), and the stage resumes from its checkpoint when the flow runs again."""
    log = get_run_logger().info
    store = Store.from_env()
    if store is not None:  # trained on another machine: its outcome from the store, as JSON
        done = _done_elsewhere(store, stage, init_hash, run_root, root)
        if done is not None:
            log(f"{stage.name}: trained on another machine (flow run {done.flow_run_id}); its outcome from the store")
            return done
    phases = PrefectPhases(stage.name)
    machines = submit_machines if deployment.get_id() is not None else None
    outcome = train(stage, init_lora, run_root, root, tracking, phases, prompts, log=log, start_machines=machines)
    outcome = outcome.replace(flow_run_id=str(flow_run.get_id()))
    if store is not None:
        publish_outcome(store, run_root, stage.name, outcome.to_json(), root)
    return outcome


def _done_elsewhere(
    store: Store, stage: StageConfig, init_hash: str | None, run_root: str, root: str
) -> StageOutcome | None:
    """The outcome another machine published for this stage, when the output here is intact (restored from the
    store by the flow) and is the one that outcome names; None otherwise (the stage trains, or resumes)."""
    if not output_is_intact(stage, run_root, init_hash):
        return None
    out_dir, work_dir = stage_dirs(run_root, stage.name)
    digest = str(json.loads((work_dir / MANIFEST).read_text())["hash"])
    published = published_outcome(store, run_root, stage.name, digest, root)
    if published is None:
        return None
    try:
        return StageOutcome.from_json(published).replace(out_dir=str(out_dir))
    except (TypeError, ValueError):
        return None  # not an outcome this code wrote: train (resume) instead


def _eval_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    cfg: StageConfig = parameters["stage"]
    prompts = _file_hash(Path(parameters["root"]) / cfg.eval_prompts) if cfg.eval_prompts else None
    evaluated = cfg.model_dump(mode="json", exclude={"launch"})  # the final evaluation runs in this process
    return "evaluate-" + _digest(evaluated, parameters["out_dir"], parameters["adapter_hash"], prompts, code_version())


@task(name="evaluate", cache_key_fn=_eval_key, persist_result=True, task_run_name="{stage.name}/evaluate")
def evaluate_task(stage: StageConfig, out_dir: str, adapter_hash: str, root: str = ".") -> StageEvaluation:
    """Evaluate the exported adapter (``adapter_hash`` is read only by the cache key); the grid goes beside the
    run's outputs."""
    return evaluate(stage, out_dir, root, grid_path(Path(out_dir).parent.parent, stage.name, adapter_hash))
