#!/usr/bin/env bash
# dev/setup.sh [--test]
#
# Creates .venv with what the quickstart needs, on a fresh machine: torch 2.13.0 and the project
# (editable) with its reference server. --test adds the test suite's tools (pytest-xdist, ruff,
# matplotlib, nvidia-ml-py); dev/test.sh passes it. Stamped (.venv/.specenergy-installed holds
# the extras installed): a no-op when nothing changed. It never builds the real-SGLang
# environments: dev/test.sh builds them, in the background while the other tests run.
#
# torch is pinned to 2.13.0, the CPU build this project's machines install locally: any other
# torch spec pulls a multi-GB CUDA build. Prints each step and how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."

extras=reference
case "${1:-}" in
    "") ;;
    --test) extras=reference,test ;;
    *) echo "usage: $0 [--test]" >&2; exit 2 ;;
esac

started=$(date +%s)
say() { echo "dev/setup.sh: $* ($(( $(date +%s) - started )) s)"; }

# pip's noise: the local indexes' "is ignored" lines for packages they do not hold, and
# setuptools' editable-install banner. Anything else (errors included) is shown.
pip_quiet() {
    .venv/bin/python -m pip --disable-pip-version-check -q "$@" 2>&1 | { grep -v -E \
        "is ignored: it is neither a file nor a directory|BuildBackendWarning: Editable installation|^ +!!$|^ +\*+$|Please be careful with folders|name as your package as they may|with strategy, WheelFile|^ *$" \
        || true; }
}

stamp=.venv/.specenergy-installed
if [ ! -x .venv/bin/python ]; then
    say "creating .venv (python3 -m venv)"
    python3 -m venv .venv
fi
# An empty stamp is the older script's, which installed every extra.
have=$( [ -f "$stamp" ] && { cat "$stamp"; [ -s "$stamp" ] || echo reference,test; } || true)
covered=1
for extra in ${extras//,/ }; do
    [[ ",$have," == *",$extra,"* ]] || covered=0
done
# The tests' real model: fetched and converted once per machine (a no-op once cached).
fetch_model() {
    [ "${1:-}" = --test ] || return 0
    if dir=$(.venv/bin/python -m pytest_specenergy.refserver.fetch smollm2-135m --cached-dir); then
        say "model smollm2-135m is cached ($dir)"
    else
        say "fetching and converting model smollm2-135m (about 1-2 minutes, once)"
        .venv/bin/python -m pytest_specenergy.refserver.fetch smollm2-135m
    fi
}
if [ "$covered" = 1 ] && [ ! pyproject.toml -nt "$stamp" ]; then
    say ".venv is up to date ($have)"
    fetch_model "${1:-}"
    exit 0
fi
# One pip run: one resolution, and torch resolves to the local CPU wheel.
say "installing torch==2.13.0 (CPU) and the project [$extras] into .venv"
pip_quiet install torch==2.13.0 -e ".[$extras]"
echo "$extras" > "$stamp"
fetch_model "${1:-}"
say "done: .venv/bin/python -m pytest example_suites/quickstart runs the quickstart"
