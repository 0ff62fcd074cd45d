#!/usr/bin/env bash
# MoE experts on the GPU machine in one call: the tests, then the benchmark (bench/moe.py).
#   OPSLOT_KERNELS_LIB=<libopslot_kernels.so> OUT=<dir> bash tests/gpu/kernels/run_moe.sh
# Liger (for the comparison) is installed from .whl/ when present; its fused-MoE Triton autotune is
# switched off (LIGER_FUSED_MOE_AUTOTUNE=0: one fixed config) to keep the run short.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/moe_out}
mkdir -p "$OUT"
if ls .whl/liger_kernel-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/liger_kernel-*.whl 2>&1 | tail -2
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
export LIGER_FUSED_MOE_AUTOTUNE=${LIGER_FUSED_MOE_AUTOTUNE:-0}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv,noheader
timeout "${TEST_TIMEOUT:-120}" python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/kernels/test_moe.py \
  2>&1 | tee "$OUT/tests.txt" | tail -25
timeout "${BENCH_TIMEOUT:-150}" python3 bench/moe.py --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_log.txt" \
  | grep -v "^{" | tail -40
if [ -n "${TRAIN_STEP:-}" ]; then
  timeout "${TRAIN_TIMEOUT:-60}" python3 bench/moe.py --train-step --out "$OUT" 2>&1 | grep -v Warning | tail -12
fi
