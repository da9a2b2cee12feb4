"""``python -m benchmarks.compare``: the method comparison's grid and report (:mod:`benchmarks.compare.runner`)."""

from benchmarks.compare.runner import main

main()
