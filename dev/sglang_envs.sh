#!/usr/bin/env bash
# dev/sglang_envs.sh
#
# Builds the two environments the real-SGLang tests (tests/sglang/) need, side by side, with
# dev/sglang_env.sh: the newest (0.5.23, with what a CPU server needs) and the oldest supported
# (0.5.9, parser only) release, under .sglang-envs/ (stamped: a no-op once built). Each build
# logs to .sglang-envs/VERSION.build.log. Prints one line per environment when it is ready,
# or the log's tail and a non-zero exit when it failed. dev/test.sh runs this in the
# background while the other tests run (first build: about 2-8 minutes on 2 cores; 2.0 GB of disk,
# 3.5 GB at the build's peak, torch and triton being hardlinked to .venv's and each other's).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .sglang-envs
versions=(0.5.23 0.5.9)
pids=()
for version in "${versions[@]}"; do
    bash dev/sglang_env.sh "$version" ".sglang-envs/$version" >".sglang-envs/$version.build.log" 2>&1 &
    pids+=($!)
done
failed=0
for i in "${!versions[@]}"; do
    version=${versions[$i]}
    if wait "${pids[$i]}"; then
        tail -n 1 ".sglang-envs/$version.build.log"
    else
        failed=1
        echo "dev/sglang_envs.sh: building the SGLang $version environment failed:" >&2
        tail -n 30 ".sglang-envs/$version.build.log" >&2
    fi
done
exit "$failed"
