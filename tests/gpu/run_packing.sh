#!/usr/bin/env bash
# The packed-batch GPU pass (issue 29) in one call of the device machine (tables and logs to $OUT):
#   1. runtime/tests/test_packing.py: opslot_varlen against the fp64 reference on CUDA, bf16 and fp16,
#      outputs and gradients, padding, decoding, refusals, determinism;
#   2. tests/models/test_packing.py --device cuda: every real model, a packed row against its documents
#      run alone, bf16 on the cuda kernels and PyTorch's FlashAttention;
#   3. tests/models/test_gated_delta_net.py --device cuda (the Qwen3.5 packed path through the kernels);
#   4. bench/packing.py: padded sdpa, packed sdpa and packed opslot_varlen, Qwen3 and Qwen3.5.
# Built here first: `make device-bin` (or `make static`; scripts/device-env.sh reads .device-bin/).
# Then, on the device machine: bash tests/gpu/run_packing.sh (carry .device-bin).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/build-gpu-packing}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 USE_HUB_KERNELS=0
source "$ROOT/scripts/device-env.sh" || exit 2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/summary.txt"
step() {  # step NAME TIMEOUT CMD...: runs CMD with a time limit, output to $OUT/NAME.txt, status to summary
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  printf '%-12s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" \
    "$(grep -E '(passed|failed)' "$OUT/$name.txt" | tail -1)" | tee -a "$OUT/summary.txt"
}
SITE=$(python3 -c 'import os, transformers; print(os.path.dirname(os.path.dirname(transformers.__file__)))')
"$PATCHGEN" --all --source-root "$SITE" > "$OUT/generate.txt" 2>&1  # generated/ (docs/packing.md's recipe imports it)
PART=${PART:-all}
if [[ $PART != bench ]]; then
step op "${OP_TIMEOUT:-60}" bash -c "cd runtime && python3 -m pytest -q -p no:cacheprovider -rf tests/test_packing.py"
step models "${MODELS_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider -rf tests/models/test_packing.py \
  --device cuda --patchgen "$PATCHGEN"
step gdn "${GDN_TIMEOUT:-90}" python3 -m pytest -q -p no:cacheprovider -rf tests/models/test_gated_delta_net.py \
  --device cuda --patchgen "$PATCHGEN"
fi
if [[ $PART != tests ]]; then
step bench "${BENCH_TIMEOUT:-300}" python3 bench/packing.py --patchgen "$PATCHGEN" --models qwen3,qwen3_5 --out "$OUT"
fi
cat "$OUT/summary.txt"
