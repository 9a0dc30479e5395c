#!/usr/bin/env bash
# The course on a CUDA machine: GPU-guarded cells run (COURSE_DEVICE=cuda makes a missing GPU an
# error, not a silent CPU run), every notebook and unit test in quick mode, within 15 minutes.
# Writes build/gpu-check/gpu-check.log (and junit.xml); exit status is pytest's.
# Usage: make gpu-check   (or: bash tools/gpu_check.sh, with .venv set up)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=build/gpu-check
mkdir -p "$OUT"
LOG="$OUT/gpu-check.log"
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu-check: no nvidia-smi here; this check needs a machine with an NVIDIA GPU and its driver." | tee "$LOG"
    exit 2
fi
{
    echo "== $(date -u +%FT%TZ) gpu-check"
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
    COURSE_DEVICE=cuda "$PY" -m course_utils doctor
    echo "== unit tests and notebooks, quick mode, COURSE_DEVICE=cuda"
    start=$SECONDS
    COURSE_DEVICE=cuda COURSE_QUICK=1 timeout 900 "$PY" -m pytest -q --junitxml="$OUT/junit.xml" "$@"
    status=$?
    echo "== pytest exit status $status after $((SECONDS - start)) s"
    exit $status
} 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
