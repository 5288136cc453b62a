#!/usr/bin/env bash
# Regenerate infra/requirements-gpu.lock: every pin of the GPU worker image (the project's dependencies + the
# gpu extra's vLLM, with infra/gpu-overrides.txt) for Linux x86_64 (manylinux_2_28), CUDA wheels, CPython 3.11
# (the image's python:3.11-slim). A resolver dry run: nothing is installed, no GPU needed, any OS.
#   pip install uv                     # anywhere, e.g. a throw-away venv outside the repo
#   bash infra/gpu-lock.sh             # writes infra/requirements-gpu.lock (~30 s)
#   UV=/path/to/uv PYTHON_VERSION=3.12 bash infra/gpu-lock.sh --output-file /tmp/gpu-3.12.lock   # other targets
# Extra arguments go to `uv pip compile`. A resolver error names the clash ("because X depends on ...").
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-uv}
UV_PYTHON_DOWNLOADS=never "$UV" pip compile pyproject.toml --extra gpu --override infra/gpu-overrides.txt \
  --python-platform x86_64-manylinux_2_28 --python-version "${PYTHON_VERSION:-3.11}" \
  --custom-compile-command "bash infra/gpu-lock.sh" \
  --output-file infra/requirements-gpu.lock "$@"
