#!/usr/bin/env bash
# Regenerate infra/requirements-gpu.lock: every pin of the GPU worker image, i.e. `pip install .[gpu]` (the
# project's dependency ranges + the gpu extra's vLLM) resolved for Linux x86_64 (manylinux_2_28), CUDA wheels,
# CPython 3.11 (the image's python:3.11-slim). No overrides, no constraints: if this resolves, `pip install
# .[gpu]` does too. A resolver dry run: nothing is installed, no GPU needed, any OS.
#   pip install uv                     # anywhere, e.g. a throw-away venv outside the repo
#   bash infra/gpu-lock.sh             # writes infra/requirements-gpu.lock (~5 s with uv's cache)
#   UV=/path/to/uv PYTHON_VERSION=3.12 LOCK=/tmp/gpu-3.12.lock bash infra/gpu-lock.sh   # other targets
# Extra arguments go to `uv pip compile`. A resolver error names the clash ("because X depends on ...").
# tests/core/test_gpu_extra.py checks (offline) that the lock still satisfies pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-uv}
UV_PYTHON_DOWNLOADS=never "$UV" pip compile pyproject.toml --extra gpu \
  --python-platform x86_64-manylinux_2_36 --python-version "${PYTHON_VERSION:-3.11}" \
  --custom-compile-command "bash infra/gpu-lock.sh" \
  --output-file "${LOCK:-infra/requirements-gpu.lock}" "$@"
