#!/usr/bin/env bash
# The full comparison grid, then the speed table, each resumable: run it again to continue where it stopped.
#   setsid nohup scripts/bench_grid.sh > runs/bench/full/grid.log 2>&1 &     # in the background, with a log
# Cells and timings wait while other processes load the cores (benchmarks/provenance.py); the grid writes its
# records back to docs/benchmarks/cells.jsonl after every cell, so a fresh clone continues from the commit.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
. .venv/bin/activate
export HF_HUB_OFFLINE=1
mkdir -p runs/bench/full
python -m benchmarks.compare "$@"
python -m benchmarks.speed
