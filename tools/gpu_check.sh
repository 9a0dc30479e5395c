#!/usr/bin/env bash
# The GPU check in one command (course_utils/kit/gpu_check.py): every GPU cell of every notebook on this
# machine's GPU, the GPU unit tests, a summary in build/gpu-check/ (and in $OUT when that is set).
#
# On a lent GPU machine that has its own Python and torch but no network: build the bundle first on a
# machine with the network (make gpu-bundle), carry build/gpu-bundle with the repository, and run
#     bash tools/gpu_check.sh --jobs 6
# Its wheels are installed into a temporary folder put on PYTHONPATH; the machine's Python is not changed.
# make gpu-check runs the same from .venv (PY=.venv/bin/python BUNDLE=none). Arguments go to the check.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
BUNDLE=${BUNDLE:-build/gpu-bundle}
if compgen -G "$BUNDLE/*.whl" >/dev/null; then
    SITE=$(mktemp -d "${TMPDIR:-/tmp}/gpu-bundle-site.XXXXXX")
    if ! "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$BUNDLE"/*.whl; then
        echo "gpu-check: the wheels in $BUNDLE did not install for $("$PY" --version 2>&1); rebuild them (make gpu-bundle)"
        exit 2
    fi
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH"   # bin: tlparse's program
    echo "gpu-check: $(ls "$BUNDLE"/*.whl | wc -l) wheels from $BUNDLE installed in $SITE"
elif [ "$BUNDLE" != none ]; then
    echo "gpu-check: no wheels in $BUNDLE; running with what $PY has"
fi
exec "$PY" -m course_utils.kit.gpu_check "$@"
