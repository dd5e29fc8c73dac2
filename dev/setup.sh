#!/usr/bin/env bash
# Creates .venv with everything the quickstart and the test suite need, on a fresh machine.
# torch is pinned to 2.13.0, the CPU build this project's machines install locally: any other
# torch spec pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
stamp=.venv/.specenergy-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q torch==2.13.0
    .venv/bin/python -m pip install -q -e '.[reference,test]'
    touch "$stamp"
fi
