"""The benchmark and measuring scripts, run from the repository root as ``python -m benchmarks.<name>``.

The methods, their labels and the GenEval tags the scripts share are in :mod:`benchmarks.common`; the method
comparison is :mod:`benchmarks.compare` (the grid, :mod:`benchmarks.grid` and :mod:`benchmarks.cell`) and its report
:mod:`benchmarks.report` (statistics in :mod:`benchmarks.bootstrap` and :mod:`benchmarks.analysis`, the claims in
:mod:`benchmarks.claims` (read by :mod:`benchmarks.claim_rows`, judged by :mod:`benchmarks.verdicts`), the tables in :mod:`benchmarks.tables`, the plots in :mod:`benchmarks.plots`, the MLflow
runs in :mod:`benchmarks.mlflow_runs`). How to run each script and what it measured: ``benchmarks/README.md``.
"""
