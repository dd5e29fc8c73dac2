#!/usr/bin/env bash
# dev/test.sh [PYTEST OPTIONS...]
#
# The test suite on a fresh machine: dev/setup.sh --test (.venv with the test tools), then the
# real-SGLang environments (dev/sglang_envs.sh) built in the background while every test outside
# tests/sglang/ runs, then tests/sglang/ once they are ready (environments already built: one
# pytest run of everything). While it waits for them it prints a line of progress every 20 s.
# Options (-x, -k EXPR, ...) go to both pytest runs; the exit status is non-zero if either run
# failed or an environment did not build.
# SPECENERGY_SKIP_SGLANG=1 builds nothing and runs the whole suite at once; the real-SGLang
# tests then skip, saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
# Python keeps its bytecode caches (the gitignored __pycache__/): with PYTHONDONTWRITEBYTECODE set, as
# on this project's machines, each pytest process rewrote every test module's asserts anew (3-4 s of
# CPU) and each engine compiled the server's modules again.
unset PYTHONDONTWRITEBYTECODE
bash dev/setup.sh --test
# worksteal: the end-to-end tests take 10-90 s each; handed out up front they left one worker
# running the last of them alone for minutes while the other idled.
pytest_run() { .venv/bin/python -m pytest -p no:cacheprovider -n 2 --dist worksteal "$@"; }

if [ "${SPECENERGY_SKIP_SGLANG:-0}" = 1 ]; then
    pytest_run tests "$@"
    exit
fi

started=$(date +%s)
mkdir -p .sglang-envs
bash dev/sglang_envs.sh >.sglang-envs/build.log 2>&1 &
build=$!
# Environments already stamped (the check takes milliseconds): one session runs the whole suite,
# the live SGLang test first, so its start-up and tail overlap the other tests.
for _ in 1 2 3 4; do kill -0 "$build" 2>/dev/null && sleep 0.5; done
if ! kill -0 "$build" 2>/dev/null && wait "$build"; then
    cat .sglang-envs/build.log
    pytest_run tests "$@"
    exit
fi
echo "dev/test.sh: building the SGLang environments in the background (logs: .sglang-envs/*.build.log);" \
     "running the tests outside tests/sglang/ meanwhile"

# The last step each build has reached (sglang_env.sh prints "[N/4] ..."), and its size so far.
progress() {
    local line="" version step
    for version in 0.5.23 0.5.9; do
        step=$(grep -E "\[[0-9]/4\]|done in|up to date|failed|Error" ".sglang-envs/$version.build.log" 2>/dev/null \
               | tail -n 1 | sed -e 's/^sglang_env: //' | cut -c1-60 || true)
        line+=" $version: ${step:-starting}, $(du -sh ".sglang-envs/$version" 2>/dev/null | cut -f1 || echo 0);"
    done
    echo "dev/test.sh: SGLang environments ($(( $(date +%s) - started )) s):${line%;}"
}

status=0
pytest_run tests --ignore=tests/sglang "$@" || status=$?

while kill -0 "$build" 2>/dev/null; do
    progress
    for _ in $(seq 20); do
        kill -0 "$build" 2>/dev/null || break
        sleep 1
    done
done
if wait "$build"; then
    cat .sglang-envs/build.log
    echo "dev/test.sh: SGLang environments ready after $(( $(date +%s) - started )) s; running tests/sglang/"
    sglang_status=0
    pytest_run tests/sglang "$@" || sglang_status=$?
else
    cat .sglang-envs/build.log >&2
    echo "dev/test.sh: the SGLang environments did not build; tests/sglang/ not run" >&2
    sglang_status=1
fi
# -k or -m may leave one of the runs with nothing to collect (pytest's exit 5): not a failure
# when the other ran.
if [ "$status" = 5 ] && [ "$sglang_status" != 5 ]; then status=0; fi
if [ "$sglang_status" = 5 ] && [ "$status" != 5 ]; then sglang_status=0; fi
[ "$status" != 0 ] && exit "$status"
exit "$sglang_status"
