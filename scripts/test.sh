#!/usr/bin/env bash
# Set up (scripts/setup.sh), then lint, type-check and run the default test suite.
# Extra arguments go to pytest, e.g. ./scripts/test.sh -m slow
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
export HF_HUB_OFFLINE=1 DO_NOT_TRACK=true MLFLOW_DISABLE_TELEMETRY=true DVC_NO_ANALYTICS=1
ruff check vgrpo tasks flows services tests benchmarks scripts
ruff format --check vgrpo tasks flows services tests benchmarks scripts
mypy
if [ "$#" -eq 0 ]; then set -- -m "not slow"; fi
python -m pytest "$@"
