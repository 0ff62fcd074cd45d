#!/usr/bin/env bash
# The Gated DeltaNet GPU pass (issue 27) in one call of the device machine (tables and logs to $OUT):
#   1. the CUDA kernel tests of the delta rule and the causal conv1d, and every custom op's
#      opcheck / compile / graph-capture test (tests/gpu/kernels);
#   2. the Qwen3.5 model tests on cuda: packed rows equal separate documents, decode through the
#      cache reaches the kernels, a (fake) installed fla is bypassed (tests/models/test_gated_delta_net.py);
#   3. the real-model end-to-end test of qwen3_5 and qwen3_5_moe, including its stage with every slot
#      on its cuda kernel (tests/models/run_e2e.sh);
#   4. bench/gated_delta_rule.py (the op against opslot's torch implementation and flash-linear-attention,
#      whose wheels travel in .whl/; its Hopper refusal switched off for timing only);
#   5. bench/train_step.py: the Qwen3.5 and Qwen3 4-layer training steps.
# Built here first: `make device-bin` (or `make static`; scripts/device-env.sh reads .device-bin/).
# Then, on the device machine: bash tests/gpu/run_gdn.sh   (carry .device-bin and .whl). PART=tests runs 1-3 and
# the per-kernel profile, PART=bench 4-5 (two calls that each fit the device's 10-minute limit).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/build-gpu-gdn}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 USE_HUB_KERNELS=0
source "$ROOT/scripts/device-env.sh" || exit 2
FLA=/tmp/fla
if ls .whl/fla_core-*.whl .whl/flash_linear_attention-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$FLA" .whl/fla_core-*.whl \
    .whl/flash_linear_attention-*.whl
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/summary.txt"
step() {  # step NAME TIMEOUT CMD...: runs CMD with a time limit, output to $OUT/NAME.txt, status to summary
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  printf '%-12s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" \
    "$(grep -E '(passed|failed|PASS|FAIL)' "$OUT/$name.txt" | tail -1)" | tee -a "$OUT/summary.txt"
}
PART=${PART:-all}
if [[ $PART != bench ]]; then
KERNEL_TESTS="tests/gpu/kernels/test_gated_delta_rule.py tests/gpu/kernels/test_causal_conv1d.py
  tests/gpu/kernels/test_ops_integration.py"
step kernels "${KERNELS_TIMEOUT:-120}" python3 -m pytest -q -p no:cacheprovider -rf $KERNEL_TESTS
# A candidate library that fails its kernel tests gives way to a build of the previous source when
# $FALLBACK (a folder: libopslot_kernels.so, and overlay/ with that source's Python files, copied over
# the tree) is given; the summary says which one ran.
if [[ -n "${FALLBACK:-}" ]] && ! grep -qE '^[0-9]+ passed' <(tail -1 "$OUT/kernels.txt"); then
  export OPSLOT_KERNELS_LIB=$FALLBACK/libopslot_kernels.so
  [[ -d "$FALLBACK/overlay" ]] && cp -r "$FALLBACK/overlay/." "$ROOT/"
  echo "kernels failed with the candidate library: the rest runs on $FALLBACK" | tee -a "$OUT/summary.txt"
  step kernels_fb "${KERNELS_TIMEOUT:-120}" python3 -m pytest -q -p no:cacheprovider -rf $KERNEL_TESTS
fi
step models "${MODELS_TIMEOUT:-90}" python3 -m pytest -q -p no:cacheprovider -rf tests/models/test_gated_delta_net.py \
  --device cuda --patchgen "$PATCHGEN"
step e2e "${E2E_TIMEOUT:-100}" env OUT="$OUT/e2e" GEN_DIR=/tmp/gdn-e2e-gen tests/models/run_e2e.sh --only qwen3_5,qwen3_5_moe
cp "$OUT/e2e/e2e.md" "$OUT/e2e.md" 2>/dev/null; rm -rf "$OUT/e2e"
step profile_gdr 40 python3 bench/gated_delta_rule.py --profile --shapes step
step bench_gdr32k "${BENCH32_TIMEOUT:-60}" python3 bench/gated_delta_rule.py --no-fla --no-conv --no-torch \
  --shapes 32k --out "$OUT/gdr_32k.md"
fi
if [[ $PART != tests ]]; then
step bench_gdr "${BENCH_TIMEOUT:-180}" env PYTHONPATH="$FLA" python3 bench/gated_delta_rule.py --fla-unsafe \
  --shapes step --out "$OUT/gdr_step.md"
step train_step "${STEP_TIMEOUT:-200}" python3 bench/train_step.py --patchgen "$PATCHGEN" --models qwen3_5,qwen3 \
  --out "$OUT"
fi
cat "$OUT/summary.txt"
