#!/usr/bin/env bash
# dev/sglang_env.sh VERSION DEST [parser|server]
#
# Creates a self-contained virtual environment at DEST holding the real `sglang==VERSION` wheel,
# installed WITHOUT its dependencies (they pull CUDA torch, flashinfer, sgl-kernel, ...), plus:
#   * torch==2.13.0, the CPU build (any other torch spec pulls a multi-GB CUDA build);
#   * the few pure-Python / small packages that SGLang's own `sglang.srt.server_args` import,
#     `ServerArgs.add_cli_args`, `from_cli_args` and its CPU resolution need ("parser" set);
#   * for the "server" set (the default for 0.5.23), what a real SGLang CPU server needs to serve
#     a tiny model (HTTP stack, tokenizer, grammar backends, ...);
#   * the project's import-only stand-ins for torchvision and sgl_kernel (tests/sglang_standins/,
#     put on sys.path by a .pth file), because PyPI has no CPU build of either.
# Each dependency is installed at the version SGLang's own wheel metadata pins, when it pins one;
# torch stays 2.13.0+cpu throughout (a pip constraint: anything that wants another torch fails).
#
# Files identical to those of .venv or of a sibling environment are hardlinked to them
# (dev/share_dists.py): the 0.5.23 and 0.5.9 environments and .venv share torch and triton.
#
# Idempotent: a stamp file (DEST/.specenergy-sglang-env) records the version, the set and a hash
# of this script; a matching stamp returns at once, anything else rebuilds DEST from scratch.
# Prints what it does; exits non-zero on any failure.
set -euo pipefail

usage() { echo "usage: $0 VERSION DEST [parser|server]" >&2; exit 2; }
[ $# -ge 2 ] && [ $# -le 3 ] || usage
VERSION=$1
DEST=$2
case "$VERSION" in
    0.5.23) SET=${3:-server} ;;
    0.5.*) SET=${3:-parser} ;;
    *) echo "sglang_env: unsupported SGLang version $VERSION (0.5.x only)" >&2; exit 2 ;;
esac
case "$SET" in parser|server) ;; *) usage ;; esac

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
STANDINS="$REPO/tests/sglang_standins"
PYTHON=${PYTHON:-python3}
[ -f "$STANDINS/specenergy_standin.py" ] || { echo "sglang_env: $STANDINS is missing" >&2; exit 1; }

SCRIPT_HASH=$(sha256sum "$0" | cut -c1-16)
STAMP_TEXT="sglang=$VERSION set=$SET script=$SCRIPT_HASH"
STAMP="$DEST/.specenergy-sglang-env"

write_pth() {
    # Cheap, so always rewritten: the repository may have moved since the env was made.
    local site
    site=$("$DEST/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$STANDINS" > "$site/zz_specenergy_standins.pth"
}

# One build of DEST at a time: xdist workers and dev/setup.sh may ask for the same one; the
# second waits for the first and then finds its stamp.
mkdir -p "$(dirname "$DEST")"
exec 9>"$DEST.lock"
flock 9

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ] && [ -x "$DEST/bin/python" ]; then
    write_pth
    echo "sglang_env: $DEST is up to date ($STAMP_TEXT)"
    exit 0
fi

start=$(date +%s)
echo "sglang_env: building $DEST ($STAMP_TEXT)"
rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
"$PYTHON" -m venv "$DEST"
PY="$DEST/bin/python"
# pip, quiet, without the local index's "is ignored" noise; a pip failure fails the script.
# pip's after-install report lists every SGLang dependency left out on purpose; drop it too.
pip_q() {
    "$PY" -m pip --disable-pip-version-check -q "$@" 2>&1 | { grep -v -E \
        "is ignored: it is neither a file nor a directory|^sglang [0-9.]+ requires |^ERROR: pip's dependency resolver does not currently take" \
        || true; }
}

CONSTRAINTS="$DEST/.specenergy-constraints.txt"
echo "torch==2.13.0" > "$CONSTRAINTS"

# What DEST holds byte for byte like .venv or a sibling environment (torch, triton, ...) is
# hardlinked to it, as soon as it is installed: each one on disk once (dev/share_dists.py).
# .venv and the sibling environments (globbed at each call: a sibling may be building beside DEST).
others() {
    local other
    for other in "$REPO/.venv" "$(dirname "$DEST")"/*/; do
        [ "$(cd "$other" 2>/dev/null && pwd)" = "$(cd "$DEST" && pwd)" ] || echo "$other"
    done
}
share_dists() {
    local sources
    mapfile -t sources < <(others)
    "$PY" "$HERE/share_dists.py" "$DEST" "${sources[@]}" | tail -n 1
}

echo "sglang_env: [1/4] torch==2.13.0 (CPU)"
pip_q install -c "$CONSTRAINTS" "torch==2.13.0"
share_dists
echo "sglang_env: [2/4] sglang==$VERSION --no-deps"
pip_q install --no-deps "sglang==$VERSION"

# Import names SGLang needs, by set. Names not in SGLang's Requires-Dist are installed unpinned.
PARSER_DEPS="numpy packaging psutil requests pydantic orjson pyzmq pybase64 msgspec tqdm aiohttp
  IPython pillow starlette triton transformers tokenizers safetensors huggingface_hub
  sentencepiece partial_json_parser openai dill compressed-tensors gguf"
SERVER_DEPS="fastapi uvicorn uvloop setproctitle xxhash zstandard einops regex python-multipart
  prometheus-client interegular pyyaml scipy apache-tvm-ffi jsonschema watchfiles
  openai-harmony anthropic blobfile tiktoken py-spy distro easydict soundfile"
# Installed --no-deps (their own deps would pull CUDA torch); version from SGLang's pins.
SERVER_NODEPS="xgrammar llguidance"

DEPS=$PARSER_DEPS
[ "$SET" = server ] && DEPS="$DEPS $SERVER_DEPS"

# Requirement strings at SGLang's own pins (its wheel metadata), markers evaluated here.
pinned() {
    "$PY" - "$@" <<'PYEOF'
import re, sys
from importlib.metadata import requires
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
pins = {}
for line in requires("sglang") or []:
    req, _, marker = line.partition(";")
    if "extra ==" in marker:
        continue
    name = re.match(r"\s*([A-Za-z0-9_.-]+)", req).group(1)
    spec = req[len(req) - len(req.lstrip()) + len(name):].strip()
    spec = re.sub(r"\[.*?\]", "", spec).strip()
    if marker.strip():
        try:
            from packaging.markers import Marker
            if not Marker(marker).evaluate():
                continue
        except Exception:
            pass
    pins[norm(name)] = spec
for name in sys.argv[1:]:
    print(name + pins.get(norm(name), ""))
PYEOF
}

echo "sglang_env: [3/4] $SET dependencies (at SGLang $VERSION's pins)"
# packaging first: the pin reader uses it for environment markers.
pip_q install -c "$CONSTRAINTS" packaging
# shellcheck disable=SC2086
mapfile -t REQS < <(pinned $DEPS)
[ "${#REQS[@]}" -gt 0 ] || { echo "sglang_env: could not read SGLang's pins" >&2; exit 1; }
echo "sglang_env:   ${REQS[*]}"
pip_q install -c "$CONSTRAINTS" "${REQS[@]}"
if [ "$SET" = server ]; then
    # shellcheck disable=SC2086
    mapfile -t NODEPS < <(pinned $SERVER_NODEPS)
    echo "sglang_env:   --no-deps ${NODEPS[*]}"
    pip_q install --no-deps "${NODEPS[@]}"
fi

share_dists

echo "sglang_env: [4/4] stand-ins ($STANDINS) and checks"
write_pth
"$PY" - "$VERSION" "$SET" <<'PYEOF'
import argparse, importlib.metadata as md, sys
version, kind = sys.argv[1], sys.argv[2]
torch_version = md.version("torch")
assert torch_version.startswith("2.13.0") and "+cpu" in torch_version, \
    f"torch {torch_version} is not the CPU build 2.13.0"
assert md.version("sglang") == version, md.version("sglang")
for dist in ("torchvision", "sgl-kernel", "sglang-kernel"):
    try:
        md.version(dist)
    except md.PackageNotFoundError:
        continue
    raise SystemExit(f"sglang_env: the real {dist} got installed; it must stay a stand-in")
import torchvision, sgl_kernel
assert "sglang_standins" in torchvision.__file__ and "sglang_standins" in sgl_kernel.__file__
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
parser.parse_args(["--model-path", "x"])
if kind == "server":
    import sglang.launch_server, sglang.srt.entrypoints.http_server  # noqa: F401
print(f"sglang_env:   ok: sglang {version} ({kind}), torch {torch_version}, stand-ins on sys.path")
PYEOF
echo "$STAMP_TEXT" > "$STAMP"
# du counts a linked file once, under the first folder that holds it: the last line is DEST's own.
mapfile -t sources < <(others)
own=$(du -sh "${sources[@]}" "$DEST" 2>/dev/null | tail -n 1 | cut -f1)
echo "sglang_env: done in $(( $(date +%s) - start )) s; $(du -sh "$DEST" | cut -f1) at $DEST ($own not shared)"
