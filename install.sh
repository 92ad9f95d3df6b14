#!/usr/bin/env bash
# Install Gossamer into the active Python environment: `./install.sh` or `./install.sh test`.
# A machine without torch gets the CPU build when it has no NVIDIA GPU; an existing torch
# (for example a user's CUDA build) is left alone.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python}
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "$PYTHON" -m pip install torch
  else
    "$PYTHON" -m pip install "torch==2.13.0"
  fi
fi
"$PYTHON" -m pip install -e ".${1:+[$1]}"
