#!/usr/bin/env bash
# Fill wheels/ with what scripts/gpu_check.sh installs on a GPU machine that cannot download: the project's
# dependencies that such a machine's Python lacks when it has torch, transformers, accelerate and peft (diffusers
# and pydantic with their own needs), as wheels for its Python and platform. Run it on a machine with network
# access, then bring wheels/ along (it is git-ignored; e.g. `carry` it to the device).
#
#   scripts/gpu_wheels.sh                 # CPython 3.12 on x86-64 Linux (the H200 image's Python)
#   PY_VERSION=3.11 scripts/gpu_wheels.sh
#
# Versions are the lock's (constraints.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
PY_VERSION=${PY_VERSION:-3.12}
PACKAGES=(diffusers pydantic pydantic_core annotated-types typing-inspection typing_extensions)

pins=()
for name in "${PACKAGES[@]}"; do
    pin=$(grep -i -E "^${name//[-_]/[-_]}==" constraints.txt) || { echo "gpu_wheels: $name is not in constraints.txt" >&2; exit 2; }
    pins+=("$pin")
done
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
    platforms+=(--platform "$p")
done
mkdir -p wheels
"$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
    "${platforms[@]}" -d wheels "${pins[@]}"
ls -l wheels
