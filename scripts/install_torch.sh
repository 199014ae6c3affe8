#!/usr/bin/env bash
# Install the pinned torch into the given Python's environment, never a CUDA build on a
# machine without CUDA:
#   - CUDA present (nvidia-smi lists a GPU): the regular build from PyPI;
#   - otherwise a CPU build: a local "+cpu" wheel when pip's find-links has one (as on our
#     build machines), else PyTorch's CPU wheel index.
set -euo pipefail
PY=${1:?usage: install_torch.sh PYTHON [VERSION]}
VERSION=${2:-2.13.0}

if "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$VERSION' else 1)" 2>/dev/null; then
    exit 0
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "CUDA found: installing torch==$VERSION"
    exec "$PY" -m pip install -q "torch==$VERSION"
fi
echo "no CUDA: installing the CPU build of torch==$VERSION"
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
if "$PY" -m pip download -q --no-deps --no-index -d "$wheels" "torch==$VERSION" 2>/dev/null \
        && ls "$wheels"/torch-*+cpu-*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q "$wheels"/torch-*.whl
else
    "$PY" -m pip install -q "torch==$VERSION" --index-url https://download.pytorch.org/whl/cpu \
        --extra-index-url https://pypi.org/simple
fi
