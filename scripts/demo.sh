#!/usr/bin/env bash
# Set up, then run V-GRPO and every baseline for two iterations on a tiny random SD3 transformer.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
HF_HUB_OFFLINE=1 python -m vgrpo.demo "$@"
