#!/usr/bin/env bash
# The whole GPU pass in one call of the device machine (tables and logs to $OUT, at most 8 files):
#   1. the real-model end-to-end test on cuda: eager bit-exact, `torch` kernels, every slot that has
#      a `cuda` kernel on it (tests/models/run_e2e.sh);
#   2. every CUDA kernel test (tests/gpu/kernels) against the final libopslot_kernels.so;
#   3. the checkpoint/behaviour parity suite on cuda (tests/models/test_hf_parity.py);
#   4. the runtime tests (cpu and cuda);
#   5. bench/kernels.py (norms, RoPE, SiLU-mul, load-balancing loss).
# Built here first: `make static` (patchgen + libopslot_kernels.so in .device-bin/). Then, on the
# device machine: bash tests/gpu/run_all.sh   (carry .device-bin and .whl)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/build-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 USE_HUB_KERNELS=0
export OPSLOT_KERNELS_LIB=${OPSLOT_KERNELS_LIB:-$ROOT/.device-bin/libopslot_kernels.so}
export PATCHGEN=${PATCHGEN:-$ROOT/.device-bin/patchgen} PATCHGEN_BIN=${PATCHGEN_BIN:-$ROOT/.device-bin/patchgen}
if ls .whl/liger_kernel-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/liger_kernel-*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/summary.txt"
BUDGET=${BUDGET:-100000}  # seconds for the whole pass: a step that cannot start in time is skipped, and said so
step() {  # step NAME TIMEOUT CMD...: runs CMD with a time limit, output to $OUT/NAME.txt, status to summary
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  if (( SECONDS + 20 > BUDGET )); then
    printf '%-14s skipped: the budget of %ss is spent\n' "$name" "$BUDGET" | tee -a "$OUT/summary.txt"; return
  fi
  (( SECONDS + limit > BUDGET )) && limit=$((BUDGET - SECONDS))
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  printf '%-14s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$(grep -E '(passed|failed|PASS|FAIL)' "$OUT/$name.txt" | tail -1)" \
    | tee -a "$OUT/summary.txt"
}
step e2e "${E2E_TIMEOUT:-150}" env OUT="$OUT/e2e" GEN_DIR=/tmp/e2e-gen tests/models/run_e2e.sh
cp "$OUT/e2e/e2e.md" "$OUT/e2e.md" 2>/dev/null; rm -rf "$OUT/e2e"
step kernel_tests "${KERNEL_TESTS_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider -rf tests/gpu/kernels
step hf_parity "${HF_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider -rf tests/models/test_hf_parity.py \
  --device cuda --patchgen "$PATCHGEN"
step runtime "${RUNTIME_TIMEOUT:-120}" bash -c "cd runtime && python3 -m pytest -q -p no:cacheprovider -rf tests"
if [[ -z "${SKIP_BENCH:-}" ]]; then
  step bench_kernels "${BENCH_TIMEOUT:-200}" python3 bench/kernels.py --out "$OUT/kernels_h200.md" ${BENCH_ARGS:-}
fi
cat "$OUT/summary.txt"
