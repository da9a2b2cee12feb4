"""The benchmarks, run from the repository root: the method comparison, a package of its own
(:mod:`benchmarks.compare`, ``python -m benchmarks.compare``), and the standalone measuring scripts beside it
(``python -m benchmarks.<name>``).

What they share: the methods, their labels and the GenEval tags (:mod:`benchmarks.common`) and the provenance of a
measurement (:mod:`benchmarks.provenance`). How to run each and what it measured: ``benchmarks/README.md``.
"""
