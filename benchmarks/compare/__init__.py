"""The method comparison: V-GRPO against the baselines and its ablations on the embedded base, as a grid of cells
and the report that judges the paper's claims on them.

    python -m benchmarks.compare [--quick]                                        # run (or resume) the grid
    python -m benchmarks.compare.report docs/benchmarks/cells.jsonl docs/benchmarks  # the report again

The grid: its plan (:mod:`~benchmarks.compare.plan`), one cell (:mod:`~benchmarks.compare.cell`) and the runner
(:mod:`~benchmarks.compare.runner`). The report (:mod:`~benchmarks.compare.report`): the records' statistics
(:mod:`~benchmarks.compare.analysis`, :mod:`~benchmarks.compare.bootstrap`, :mod:`~benchmarks.compare.collapse`,
:mod:`~benchmarks.compare.studentized`), the claims as a table of data (:mod:`~benchmarks.compare.claims`, built
from :mod:`~benchmarks.compare.rules`) read by :mod:`~benchmarks.compare.claim_rows` and judged by
:mod:`~benchmarks.compare.verdicts`, the tables (:mod:`~benchmarks.compare.method_tables`,
:mod:`~benchmarks.compare.phase_tables`), the plots and the MLflow runs; and the power analysis on the committed
records (:mod:`~benchmarks.compare.power`).
"""
