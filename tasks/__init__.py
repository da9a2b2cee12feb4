"""The units the pipeline runs, over :mod:`vgrpo`: they pass validated configs, paths and content hashes, not
tensors.

The plain bodies import no Prefect: :mod:`tasks.stage` (train one curriculum stage with its MLflow run, evaluate
its export; what DVC's stage command :mod:`tasks.dvc_stage` runs), :mod:`tasks.outcome` (what a stage returns),
:mod:`tasks.launch` (a stage on several processes), :mod:`tasks.callbacks` and :mod:`tasks.tracking` (MLflow).
Their Prefect wrappers sit beside them: :mod:`tasks.stage_tasks` (the cached tasks) and :mod:`tasks.phase_tasks`
(each phase as a task run).
"""
