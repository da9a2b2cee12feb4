#!/usr/bin/env bash
# The one-GPU check (python -m benchmarks.gpu_check): the gpu-marked tests, benchmarks.sd35_arch at the paper's scale
# and one short embedded stage on the GPU, in at most 10 minutes; writes gpu_check.json and gpu_check.md under
# $OUT when it is set, else runs/gpu_check/ (or --out DIR).
#
#   scripts/gpu_check.sh              # on a machine with one CUDA GPU
#   scripts/gpu_check.sh --dry-run    # the same steps at tiny sizes on the CPU (tests/benchmarks/test_gpu_check.py runs it)
#
# The GPU machine's Python needs torch, transformers, accelerate and peft; nothing can be downloaded there. When
# diffusers or pydantic is missing, the wheels under wheels/ are installed (--no-index) into a folder on
# PYTHONPATH: fill wheels/ beforehand on a machine with network access with scripts/gpu_wheels.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if ! "$PYTHON" -c "import diffusers, pydantic" 2>/dev/null; then
    if ! compgen -G "wheels/*.whl" >/dev/null; then
        echo "gpu_check: diffusers or pydantic is missing and wheels/ holds no wheels; run scripts/gpu_wheels.sh" \
             "on a machine with network access and bring wheels/ along" >&2
        exit 2
    fi
    site=$(mktemp -d /tmp/vgrpo-wheels.XXXXXX)
    "$PYTHON" -m pip install -q --no-index --find-links wheels --no-deps --no-compile --no-cache-dir \
        --target "$site" wheels/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" VGRPO_WHEELS_INSTALLED="$site"
fi
exec "$PYTHON" -m benchmarks.gpu_check "$@"
