#!/usr/bin/env bash
# Create .venv (Python 3.11) and install vgrpo with the locked dependency set in constraints.txt.
# On these CPU machines torch==2.13.0 resolves to the CPU wheel that lies on disk.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    echo "vgrpo needs Python 3.11; $PYTHON is $("$PYTHON" --version 2>&1)" >&2
    exit 1
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
# A current pip resolves the ~230 locked pins much faster than the 23.x that venv seeds.
python -m pip install --quiet --disable-pip-version-check --upgrade "pip>=25"
python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[pipeline,cluster,dev]"
