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
# The real-SGLang tests (tests/sglang/) need two environments: the newest (0.5.23, with what a
# CPU server needs) and the oldest supported (0.5.9, parser only) release, built by
# dev/sglang_env.sh (stamped: a no-op once built). Built here, both at once, so the test run
# finds them ready (first build: about 5-8 minutes and 5 GB on 2 cores; the tests would
# otherwise build them themselves, inside the suite's time). SPECENERGY_SKIP_SGLANG=1 skips
# them, and the tests then skip saying why.
if [ "${SPECENERGY_SKIP_SGLANG:-0}" != 1 ]; then
    mkdir -p .sglang-envs
    pids=()
    for version in 0.5.23 0.5.9; do
        bash dev/sglang_env.sh "$version" ".sglang-envs/$version" >".sglang-envs/$version.build.log" 2>&1 &
        pids+=($!)
    done
    failed=0
    for i in 0 1; do
        version=$([ "$i" = 0 ] && echo 0.5.23 || echo 0.5.9)
        if wait "${pids[$i]}"; then
            tail -n 1 ".sglang-envs/$version.build.log"
        else
            failed=1
            echo "dev/setup.sh: building the SGLang $version environment failed:" >&2
            tail -n 30 ".sglang-envs/$version.build.log" >&2
        fi
    done
    [ "$failed" = 0 ] || exit 1
fi
