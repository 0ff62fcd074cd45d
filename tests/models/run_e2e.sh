#!/usr/bin/env bash
# GPU end-to-end test of the real-model specs: generate every spec under specs/<model>/ against the
# installed transformers with the static patchgen, then check each generated model against
# upstream on the GPU (tests/models/e2e.py says what is checked).
#
#   tests/models/run_e2e.sh [--only llama,qwen3]
#
# Environment: PATCHGEN (default .device-bin/patchgen, from `make static`), PYTHON (default
# python3, the one with torch and transformers), OUT (where the result table goes; default
# build-gpu-e2e/), GEN_DIR (generated files; default a temporary folder, never committed).
# Exit status: 0 when every model passes, 1 when any fails, 2 when the setup is broken.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
PATCHGEN=${PATCHGEN:-$ROOT/.device-bin/patchgen}
PYTHON=${PYTHON:-python3}
OUT=${OUT:-$ROOT/build-gpu-e2e}
GEN_DIR=${GEN_DIR:-$(mktemp -d /tmp/patchgen-gpu-e2e.XXXXXX)}

if [[ ! -x "$PATCHGEN" ]]; then
  echo "run_e2e.sh: no patchgen binary at $PATCHGEN (build it with 'make static', or set PATCHGEN)" >&2
  exit 2
fi
# The folder that holds the transformers package (site-packages), found without importing torch.
SITE=$("$PYTHON" -c 'import importlib.util, os; s = importlib.util.find_spec("transformers"); print(os.path.dirname(os.path.dirname(s.origin)))') || {
  echo "run_e2e.sh: $PYTHON cannot find transformers" >&2
  exit 2
}
mkdir -p "$OUT"
echo "patchgen: $PATCHGEN; transformers from: $SITE; generated files: $GEN_DIR; results: $OUT"

export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 USE_HUB_KERNELS=0
export PYTHONPATH="$ROOT/runtime${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" "$ROOT/tests/models/e2e.py" --patchgen "$PATCHGEN" --source-root "$SITE" \
  --gen-dir "$GEN_DIR" --out "$OUT" "$@"
